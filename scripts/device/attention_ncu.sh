#!/usr/bin/env bash
# Nsight Compute over the fused attention kernels (one call per mask and length), plus their resource usage.
#
#   bash scripts/device/attention_ncu.sh OUT_DIR SECONDS [attention_ncu_target.py options]   (repository root, GPU machine)
#
# Builds the package (without tscale._C_cutlass) unless it is importable, then profiles
# scripts/bench/attention_ncu_target.py with ncu (clocks left alone) and writes OUT_DIR/attention.ncu-rep,
# attention_details.txt (every section of every kernel) and resources.txt (registers, shared memory, spills
# from cuobjdump), attention_raw.csv (every metric) and attention_stalls.txt (scripts/bench/ncu_stalls.py: each
# kernel's busy shares and largest stall reasons, also printed). Stops SECONDS after the start.
set -u -o pipefail
OUT=${1:?usage: attention_ncu.sh OUT_DIR SECONDS [options]}
source scripts/device/deadline.sh "${2:?usage: attention_ncu.sh OUT_DIR SECONDS [options]}"
shift 2
export PYTHONUNBUFFERED=1 TSCALE_NO_CUTLASS=1
mkdir -p "$OUT/logs"
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import torch, pydantic, tscale._C" 2>/dev/null || source scripts/device/setup_env.sh "$OUT/logs" || exit 1
so=$(python3 -c "import torch, tscale._C as c; print(c.__file__)")
cuobjdump -res-usage "$so" 2>/dev/null | grep -A1 -E "attention|doc_stats" | grep -v "^--" > "$OUT/resources.txt"
grep -c . "$OUT/resources.txt"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout "$(left)" "$NCU" --clock-control none --profile-from-start off --set full --kernel-name regex:attention \
  -f -o "$OUT/attention" python3 scripts/bench/attention_ncu_target.py "$@" > "$OUT/logs/ncu.log" 2>&1
echo "ncu exit $?"; tail -5 "$OUT/logs/ncu.log"
"$NCU" --import "$OUT/attention.ncu-rep" --page details > "$OUT/attention_details.txt" 2>&1
"$NCU" --import "$OUT/attention.ncu-rep" --page raw --csv \
  --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem \
  > "$OUT/attention_summary.csv" 2>&1
wc -l "$OUT/attention_details.txt"
"$NCU" --import "$OUT/attention.ncu-rep" --page raw --csv --print-units base > "$OUT/attention_raw.csv" 2>&1
python3 scripts/bench/ncu_stalls.py "$OUT/attention_raw.csv" | tee "$OUT/attention_stalls.txt"
