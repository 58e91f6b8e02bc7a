"""A two-site cluster of one A100 and one T4 (4.8x apart in peak FLOP/s): the smallest mixed cluster the
adaptive-local-steps and asynchronous tests train and plan on. TWO_GPUS_YAML: 1 Gbit/s and 20 ms between them;
LAN_GPUS_YAML: 100 Gbit/s and 0.1 ms (links too fast to matter)."""


def two_gpus_yaml(name: str, gbps: float, ms: float) -> str:
    """The cluster file of the A100 site "fast" and the T4 site "slow", `gbps` and `ms` between them."""
    return f"""name: {name}
regions:
  - {{name: fast, devices: 1, gpu: A100}}
  - {{name: slow, devices: 1, gpu: T4}}
links:
  - {{between: [fast, slow], gbps: {gbps}, ms: {ms}}}
"""


TWO_GPUS_YAML = two_gpus_yaml("two-gpus", 1.0, 20)
LAN_GPUS_YAML = two_gpus_yaml("lan-gpus", 100.0, 0.1)
