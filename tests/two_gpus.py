"""A two-site cluster of one A100 and one T4 (4.8x apart in peak FLOP/s, 1 Gbit/s and 20 ms between them): the
smallest mixed cluster the adaptive-local-steps tests train and plan on."""

TWO_GPUS_YAML = """name: two-gpus
regions:
  - {name: fast, devices: 1, gpu: A100}
  - {name: slow, devices: 1, gpu: T4}
links:
  - {between: [fast, slow], gbps: 1.0, ms: 20}
"""
