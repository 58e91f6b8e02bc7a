"""`geotrain train` inside `geotrain netlab run`: each lab namespace is one host (node d<device>).

netlab runs this once per device, with the lab's MASTER_ADDR (the namespace of netlab's rank 0, which
with --plan is the plan's rank 0) and GEOTRAIN_DEVICE; the script drops the launcher variables and
starts `geotrain train --node d<device> --rdzv <rank 0's lab address>:<MASTER_PORT + 1>`, so the
runtime's multi-host path runs its ranks over the lab's shaped links (docs/history/hosts.md). The cluster
file must name host d<k> for device k. Example (docs/history/netlab.md):

    geotrain netlab run --cluster C.yaml --plan P.json -- benchmarks/netlab_train_node.py \
        --cluster C.yaml --plan P.json --steps 6 --time-scale 0 --json
"""
import os
import sys

from geotrain.cli.main import main

if __name__ == "__main__":
    rdzv = f"{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT']) + 1}"  # netlab's rank 0 = the plan's rank 0
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
                "MASTER_PORT"):
        os.environ.pop(key, None)
    sys.exit(main(["train", *sys.argv[1:], "--node", f"d{os.environ['GEOTRAIN_DEVICE']}", "--rdzv", rdzv]))
