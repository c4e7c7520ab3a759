#!/bin/bash
# Every goal's exports on the real NCCL library, 8 ranks sharing one GPU (each rank its own
# NCCL_HOSTID, so NCCL connects them over sockets): the NCCL C file and the torch script with
# --backend nccl, each with --check (the program's result equals NCCL's own collective).
#
#   bash benchmarks/gpu_goal_check.sh prepare DIR   # here, with synth installed: writes the exports
#   bash benchmarks/gpu_goal_check.sh run DIR       # on the GPU machine: needs torch (CUDA), gcc,
#                                                   # the CUDA toolkit and NCCL's headers; not synth
# The exports are self-contained, so the GPU machine needs no synth. Exit 1 if any check fails.
set -u
mode=${1:-}; dir=${2:-}
if [ -z "$mode" ] || [ -z "$dir" ]; then echo "usage: $0 prepare|run DIR" >&2; exit 2; fi
GOALS="allreduce reducescatter allgather alltoall broadcast reduce"
if [ "$mode" = prepare ]; then
  mkdir -p "$dir" || exit 2
  for goal in $GOALS; do  # the two fastest programs (C) and the fastest (torch) on a 2 x 4 system
    synth export --topology emu-2x4-gloo --axes data=8 --reduce data --collective $goal --top 2 --max-len 4 \
      --format nccl -o "$dir/$goal.c" || exit 1
    synth export --topology emu-2x4-gloo --axes data=8 --reduce data --collective $goal --top 1 --max-len 4 \
      --format torch -o "$dir/$goal.py" || exit 1
  done
  # programs that leave blocks permuted, with their stated local permutations
  synth export --levels node=2,gpu=4 --axes 8 --reduce a0 --collective alltoall --format nccl \
    --program 'AllToAll(Parallel(node)); Permute(gpu,node); AllToAll(InsideGroup(gpu)); Permute(node,gpu)' \
    -o "$dir/permuted_alltoall.c" || exit 1
  for format in nccl torch; do
    extension=c; [ $format = torch ] && extension=py
    synth export --levels node=2,gpu=4 --axes 8 --reduce a0 --collective reducescatter --format $format \
      --program 'Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))' \
      -o "$dir/permuted_reducescatter.$extension" || exit 1
  done
  exit 0
fi
[ "$mode" = run ] || { echo "usage: $0 prepare|run DIR" >&2; exit 2; }
cd "$dir" || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cuda=$(dirname "$(dirname "$(which nvcc)")")
nccl_h=$(find "$site" "$cuda"/ /usr/include -name nccl.h 2>/dev/null | head -1)
nccl_so=$(find "$site" "$cuda"/ /usr/lib -name 'libnccl.so*' 2>/dev/null | head -1)
cudart=$(find "$cuda"/ "$site" -name 'libcudart.so*' 2>/dev/null | head -1)
echo "nccl.h: $nccl_h; libnccl: $nccl_so; CUDA: $cuda; cudart: $cudart"
grep -m3 "define NCCL_MAJOR\|define NCCL_MINOR\|define NCCL_PATCH" "$nccl_h"
nccl_lib=$(dirname "$nccl_so"); cuda_lib=$(dirname "$cudart")
mkdir -p bin; passed=0; failed=0
run_c() {  # $1 source file, $2 binary name
  gcc -std=c11 -O2 -Wall -Wextra -Werror "$1" -I"$cuda/include" -I"$(dirname "$nccl_h")" -L"$nccl_lib" -L"$cuda_lib" \
    -l:"$(basename "$nccl_so")" -l:"$(basename "$cudart")" -Wl,-rpath,"$nccl_lib:$cuda_lib" -o "bin/$2" || return 1
  rm -f "/tmp/$2.id"; pids=""
  for rank in 0 1 2 3 4 5 6 7; do
    RANK=$rank WORLD_SIZE=8 LOCAL_RANK=$rank LOCAL_WORLD_SIZE=8 SYNTH_NCCL_ID_FILE="/tmp/$2.id" SYNTH_NCCL_TIMEOUT=60 \
      timeout 90 "./bin/$2" --check -b 1K -e 4M -f 4 -n 5 -w 2 > "/tmp/$2.$rank.log" 2>&1 & pids="$pids $!"
  done
  status=0; for pid in $pids; do wait "$pid" || status=1; done
  echo "=== C $1 (exit $status)"; cat "/tmp/$2.0.log"
  [ $status = 0 ] && grep -q "check passed" "/tmp/$2.0.log"
}
n=0
for source in */program_*.c permuted_*.c; do n=$((n+1)); start=$(date +%s)
  if run_c "$source" "c$n"; then passed=$((passed+1)); echo "PASS C $source $(( $(date +%s)-start )) s"
  else failed=$((failed+1)); echo "FAIL C $source"; fi
done
for script in */program_1.py permuted_*.py; do start=$(date +%s)
  echo "=== torch $script"
  if timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 8 "$script" --backend nccl --check \
       -b 1K -e 4M -f 4 -n 5 -w 2 2>&1 | tail -25 | tee /tmp/torch.log && grep -q "check passed" /tmp/torch.log; then
    passed=$((passed+1)); echo "PASS torch $script $(( $(date +%s)-start )) s"
  else failed=$((failed+1)); echo "FAIL torch $script"; fi
done
echo "SUMMARY passed=$passed failed=$failed"
[ $failed = 0 ]
