#!/usr/bin/env bash
# The CUDA/NCCL check: `geotrain train --device cuda` end to end on the GPUs of one machine, in
# bf16 and fp32, against the same run on CPU (same seed, same data: the losses must agree). Writes
# every run's JSON and stderr to $OUT/cuda_check.tar.gz and a summary table to stdout.
# Usage (repo root, a python3 with torch+CUDA): OUT=/tmp/out bash benchmarks/cuda/check.sh;
# The runs are sized to take about 3 minutes on one H200; CHECK_DEVICE=cpu dry-runs the script without a GPU.
set -u
OUT=${OUT:-/tmp/cuda_check_out}
RES=$(mktemp -d)
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
DEVICE=${CHECK_DEVICE:-cuda}  # CHECK_DEVICE=cpu: a dry run of the script where there is no GPU
command -v geotrain >/dev/null || python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . \
  >"$RES/install.log" 2>&1 || { cat "$RES/install.log"; exit 1; }
export PYTHONUNBUFFERED=1 GEOTRAIN_TRACEBACK=1  # a failed rank prints its traceback
{ nvidia-smi -L; python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else '-', 'gpus', torch.cuda.device_count(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"; nproc; } | tee "$RES/env.txt"
cd "$RES"
cp "$HERE/one-gpu.yaml" "$HERE/two-ranks.yaml" "$HERE/two-sites.yaml" .
geotrain plan --cluster one-gpu.yaml --stages 1 --replicas 1 --json >plan-1x1.json
geotrain plan --cluster two-ranks.yaml --stages 2 --replicas 1 --json >plan-2x1.json
geotrain plan --cluster two-ranks.yaml --stages 1 --replicas 2 --json >plan-1x2.json
geotrain plan --cluster two-ranks.yaml --stages 1 --replicas 1 --shards 2 --json >plan-1x1x2.json
geotrain plan --cluster two-sites.yaml --stages 1 --replicas 2 --shards 2 --json >plan-1x2x2.json
MEDIUM="$HERE/gpt_medium.py:gpt_medium"
# name timeout cluster plan flags...
run() {
  local name=$1 limit=$2 cluster=$3 plan=$4; shift 4
  local t0=$(date +%s.%N)
  timeout "$limit" geotrain train --cluster "$cluster" --plan "$plan" --time-scale 0 --json "$@" \
    >"$name.json" 2>"$name.err"
  local rc=$? t1=$(date +%s.%N)
  echo "$name rc=$rc wall=$(python3 -c "print(round($t1-$t0,1))")s" | tee -a runs.txt
  tail -n 3 "$name.err"
}
run tiny-$DEVICE-bf16 120 one-gpu.yaml plan-1x1.json --device $DEVICE --precision bf16 --steps 60 --eval-every 60
run tiny-$DEVICE-fp32 120 one-gpu.yaml plan-1x1.json --device $DEVICE --precision fp32 --steps 60 --eval-every 60
run tiny-cpu-fp32 120 one-gpu.yaml plan-1x1.json --device cpu --precision fp32 --steps 60 --eval-every 60
MED="--model $MEDIUM --seq-len 512 --batch-size 16 --microbatches 4 --steps 30 --eval-every 30"
run medium-$DEVICE-bf16 150 one-gpu.yaml plan-1x1.json --device $DEVICE --precision bf16 $MED
run medium-$DEVICE-fp32 150 one-gpu.yaml plan-1x1.json --device $DEVICE --precision fp32 $MED
# The other synchronisation schemes and schedules, one rank each (their code paths, not their speed),
# side by side; then two ranks, as 2 stages (NCCL between them) and as 2 replicas (the DP exchange over
# gloo beside NCCL): on one GPU both are refused (NCCL wants a GPU per rank; NCCL's own answer is run too).
V="one-gpu.yaml plan-1x1.json --device $DEVICE --precision bf16 --steps 20"
run v-int8-block 150 $V --dp-codec int8-block &
run v-sync-every 150 $V --sync-every 5 &
run v-streaming 150 $V --sync-every 4 --fragments 2 --sync-delay 1 &
# --outer-state host: the same run with the outer state pinned in host memory (its losses against v-streaming's)
run v-streaming-host 150 $V --sync-every 4 --fragments 2 --sync-delay 1 --outer-state host &
run v-onebit-adam 150 $V --optimizer onebit-adam &
run v-clip-1f1b 150 $V --clip-grad-norm 1.0 --schedule 1f1b --eval-every 10 &
run v-checkpoint 150 $V --checkpoint-dir ck --checkpoint-every 10 --stop-after 10 &
run two-stages 150 two-ranks.yaml plan-2x1.json --device $DEVICE --precision bf16 --steps 20 &
run two-replicas 150 two-ranks.yaml plan-1x2.json --device $DEVICE --precision bf16 --steps 20 --dp-codec int8-block &
cat >nccl_two_ranks.py <<'PY'
import torch, torch.distributed as dist
dist.init_process_group("nccl"); torch.cuda.set_device(0)
t = torch.ones(4, device="cuda") * (dist.get_rank() + 1); dist.all_reduce(t)
print("rank", dist.get_rank(), "all_reduce on one GPU:", t.tolist())
PY
[ "$DEVICE" = cuda ] && timeout 90 torchrun --nproc-per-node 2 nccl_two_ranks.py >nccl_two_ranks.out 2>&1
echo "raw NCCL, 2 ranks on one GPU: rc=$?"; grep -m3 "all_reduce on one GPU\|Duplicate\|Error" nccl_two_ranks.out
wait
run v-checkpoint-resume 150 $V --checkpoint-dir ck --resume
# Sharded replicas (plan --shards 2): each slot's 2 ranks hold FSDP2 shards over NCCL (the shard group inside a
# site), DiLoCo per shard across the sites over gloo; the same runs on CPU give the losses to compare. NCCL needs a
# GPU per rank: 1 x 1 x 2 needs 2 GPUs, 1 x 2 x 2 needs 4; with fewer each is refused in one line (that line is
# what the run shows then).
S="--precision fp32 --steps 20 --sync-every 5 --outer-lr 1 --outer-momentum 0"
run sharded-1x1x2-$DEVICE 150 two-ranks.yaml plan-1x1x2.json --device $DEVICE $S
run sharded-1x2x2-$DEVICE 150 two-sites.yaml plan-1x2x2.json --device $DEVICE $S --dp-codec int8-block
run sharded-1x2x2-cpu 150 two-sites.yaml plan-1x2x2.json --device cpu $S --dp-codec int8-block
# Elastic replica groups on CUDA (torchft; each group one process on GPU group mod the GPU count, the outer
# exchange's host copies on torchft's gloo group): against the same elastic run on CPU (the losses must agree).
E="two-sites.yaml plan-elastic.json --precision fp32 --steps 20 --elastic --sync-every 5 --dp-codec int8-block --dp-hierarchical"
geotrain plan --cluster two-sites.yaml --stages 1 --replicas 3 --json >plan-elastic.json
run elastic-$DEVICE 150 $E --device $DEVICE
run elastic-cpu 150 $E --device cpu
# Elastic groups of S x K = 2 processes (1 stage x 2 shards x 2 replicas, issue #46): each process on a GPU of its
# own (group x 2 + rank mod the GPU count: a group's 2 on 2 GPUs, so 1 GPU is refused in one line), FSDP2 over NCCL
# inside a site, the outer sync's host copies on torchft's gloo; group 1 killed once and restarted as one, its
# positions rejoining by live recovery. Never run on a GPU yet. The CPU run beside it is the same command (the kill
# lands at another step there: its losses are a sanity reference, not a bit-for-bit one).
K="two-sites.yaml plan-1x2x2.json --precision fp32 --steps 40 --elastic --sync-every 5 --outer-lr 1 --outer-momentum 0
  --chaos kill-site:first=5s,every=60s,site=1,count=1"
run elastic-sharded-$DEVICE 150 $K --device $DEVICE
run elastic-sharded-cpu 150 $K --device cpu
python3 "$HERE/summarise.py" . | tee summary.txt
tar czf "$OUT/cuda_check.tar.gz" -C "$RES" .
