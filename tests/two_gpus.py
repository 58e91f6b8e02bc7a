"""A two-site cluster of one A100 and one T4 (4.8x apart in peak FLOP/s): the smallest mixed cluster the
adaptive-local-steps and asynchronous tests train and plan on. TWO_GPUS_YAML: 1 Gbit/s and 20 ms between them;
LAN_GPUS_YAML: 100 Gbit/s and 0.1 ms (links too fast to matter)."""


def two_gpus_yaml(name: str, gbps: float, ms: float, devices: int = 1) -> str:
    """The cluster file of the A100 site "fast" and the T4 site "slow", `gbps` and `ms` between them; `devices` > 1
    GPUs per site (a sharded plan's slot: 100 Gbit/s and 0.05 ms inside a site)."""
    inside = "" if devices == 1 else "defaults: {intra: {gbps: 100.0, ms: 0.05}}\n"
    return f"""name: {name}
regions:
  - {{name: fast, devices: {devices}, gpu: A100}}
  - {{name: slow, devices: {devices}, gpu: T4}}
links:
  - {{between: [fast, slow], gbps: {gbps}, ms: {ms}}}
{inside}"""


TWO_GPUS_YAML = two_gpus_yaml("two-gpus", 1.0, 20)
LAN_GPUS_YAML = two_gpus_yaml("lan-gpus", 100.0, 0.1)
