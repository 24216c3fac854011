#!/usr/bin/env bash
# One device call: smoke test, path thresholds, GPU test suite, compute-sanitizer, benchmark.
# Usage (on the GPU machine, repo root): bash benchmarks/gpu_run.sh [STEPS...]
#   steps: smoke thresholds tests sanitize bench profile gaps pack  (default: all but profile,
#          gaps; pack last where OUT is set)
#   pack: every file under $OUT into $OUT/results.tar.gz (the device tool brings back only a
#         few files a call: session 78 lost three tables' files and a sanitizer log)
#   BENCH_OPS: the ops the bench step runs (default: every row-wise op, then attention)
# Logs and results go to $OUT (device tool) or benchmarks/results/.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
default_steps="smoke thresholds tests sanitize bench"
[ -n "${OUT:-}" ] && [ "$OUT" != benchmarks/results ] && default_steps="$default_steps pack"
steps=${*:-$default_steps}
status=0
for step in $steps; do
  echo "=== $step ($(date +%T)) ==="
  case $step in
    smoke)
      nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
      python -c "import cupy, cunorm; x=cupy.random.rand(4,1000,dtype='float32'); print(float(cunorm.softmax(x).sum()))" || status=1
      python tools/gpu_profile.py overhead || status=1 ;;
    profile)
      python tools/gpu_profile.py kernels  # compile first, outside the profiler
      ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
          --section WarpStateStats -k regex:softmax python tools/gpu_profile.py kernels > "$OUT/ncu.txt" 2>&1
      grep -E "softmax_|Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy|Registers Per|Block Size|Grid Size|Compute \(SM\) Throughput|Issue Slots Busy" "$OUT/ncu.txt" | cut -c1-150
      python tools/sass_summary.py 90 "cunorm::softmax_warp<cunorm::half_t, cunorm::half_t, false, 8, 32, 32, 1>" \
        "cunorm::softmax_smem<cunorm::half_t, cunorm::half_t, false, 8, 2>" \
        "cunorm::softmax_uncached<float, float, false, 4>" > "$OUT/sass-summary.txt" 2>&1; head -60 "$OUT/sass-summary.txt" ;;
    gaps)
      python tools/gpu_profile.py gaps 2>&1 | tee "$OUT/gaps.txt" || status=1
      ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
          --section WarpStateStats --section SchedulerStats -k regex:'softmax|norm' \
          python tools/gpu_profile.py gap-kernels > "$OUT/ncu-gaps.txt" 2>&1
      grep -E "^launch:|  (cunorm|_softmax|_norm)|DRAM Throughput|Duration|Achieved Occupancy|Registers Per|Block Size|Issue Slots Busy|No Eligible|Stall" \
          "$OUT/ncu-gaps.txt" | cut -c1-140 ;;
    thresholds)
      python benchmarks/thresholds.py --out "$OUT" || status=1 ;;
    tests)
      python -m pytest tests -m "gpu" -q -n 8 -p no:cacheprovider --timeout 900 --maxfail=40 2>&1 | tee "$OUT/pytest-gpu.log" | tail -30
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 python tools/sanitize.py > "$OUT/sanitize-$tool.log" 2>&1
        rc=$?; echo "compute-sanitizer $tool: exit $rc"; tail -3 "$OUT/sanitize-$tool.log"
        [ $rc = 0 ] || status=1
      done ;;
    pack)
      tmp=$(mktemp -d)
      tar -C "$OUT" -czf "$tmp/results.tar.gz" . && find "$OUT" -mindepth 1 -delete \
        && mv "$tmp/results.tar.gz" "$OUT/" && tar -tzf "$OUT/results.tar.gz" | wc -l \
        | xargs echo "entries packed into $OUT/results.tar.gz:" || status=1
      rmdir "$tmp" ;;
    bench)
      for op in ${BENCH_OPS:-softmax log_softmax layer_norm rms_norm layer_norm_residual rms_norm_residual softmax_backward log_softmax_backward layer_norm_backward rms_norm_backward attention}; do
        python -m cunorm.bench "$op" --out "$OUT" || status=1
      done ;;
  esac
done
echo "=== done: status $status ($(date +%T)) ==="
exit $status
