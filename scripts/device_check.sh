#!/usr/bin/env bash
# One call on the GPU machine: build gdscp, run the GPU tests, then the
# benchmarks. Logs and JSON go to $OUT (or ./device-out).
#
#   bash scripts/device_check.sh [tests|sweep|bench|probe|staging|context|writes|coldio|gap|all]...   (default: all; probe, staging, context, writes, coldio, gap: only when named)
#
# KvikIO, when its wheels were carried in .whl/ (see docs/benchmarks.md), is
# installed to /tmp/site and measured beside gdscp.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
steps=${*:-all}
export PYTHONUNBUFFERED=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda-13.0}

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi

echo "== build"
t0=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 ))s"
cd /tmp  # import the installed package, not the source tree
python3 -c "import gdscp, cupy; print('gdscp', gdscp.__version__, 'gpus', cupy.cuda.runtime.getDeviceCount()); print(gdscp._core.cuda_info()); print(gdscp._core.cufile_info(''))"
cd - >/dev/null

# A probe from scripts/probe, run from /tmp: title, script, log, timeout (s), lines shown.
probe() {
  echo "== $1"
  (cd /tmp && OUT="$OUT" timeout "$4" python3 "$OLDPWD/scripts/probe/$2" 2>&1) | tee "$OUT/$3" | tail -"$5"
}

rc=0
if [[ $steps == *all* || $steps == *smoke* ]]; then
  echo "== smoke"
  (cd /tmp && timeout 120 python3 "$OLDPWD/scripts/gpu_smoke.py") 2>&1 | tee "$OUT/smoke.log" | tail -30
  # libcufile logs why it refused a file here (cufile.json's logging settings).
  [ -f /tmp/cufile.log ] && tail -20 /tmp/cufile.log | tee "$OUT/cufile.log"
  df -hT /tmp / | tee -a "$OUT/smoke.log"
fi
if [[ $steps == *all* || $steps == *tests* ]]; then
  echo "== GPU tests"
  repo=$PWD
  # From /tmp, so that `import gdscp` finds the installed package, not the source tree.
  (cd /tmp && GDSCP_REQUIRE_GPU=1 timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider \
    "$repo/tests" 2>&1) | tee "$OUT/gpu-tests.log" | tail -40
  rc=${PIPESTATUS[0]}
fi
if [[ $steps == *all* || $steps == *sweep* ]]; then
  echo "== sweep"
  timeout 400 python3 scripts/gpu_sweep.py "$OUT/sweep.json" --dir /tmp 2>&1 | tee "$OUT/sweep.log" | tail -60
fi
if [[ $steps == *probe* ]]; then
  echo "== probe"
  (cd /tmp && OUT="$OUT" timeout 420 python3 "$OLDPWD/scripts/probe/gpu_probe.py" 2>&1) | tee "$OUT/probe.log" | grep -v '^cold round' | tail -80
fi
[[ $steps == *staging* ]] && probe "staging probe" staging_probe.py staging.log 400 70
[[ $steps == *context* ]] && probe "context probe" context_probe.py context.log 400 30
[[ $steps == *writes* ]] && probe "write probe" write_probe.py write.log 300 14
[[ $steps == *coldio* ]] && probe "cold-read probe" cold_probe.py coldio.log 300 14
if [[ $steps == *gap* ]]; then
  echo "== bench gap"
  (cd /tmp && OUT="$OUT" timeout 200 python3 "$OLDPWD/scripts/probe/bench_gap.py" 2>&1) | tee "$OUT/gap.log" | tail -40
  (cd /tmp
   for g in 1 0; do
     GDSCP_GROUPED_COPIES=$g timeout 150 gdscp benchmark --size 4G --threads 8,16 --mode read --dir /tmp --json > "$OUT/bench-gap-grouped$g.json" 2>/dev/null
     echo "grouped=$g rc=$?"
   done)
  python3 scripts/bench_summary.py "$OUT"/bench-gap-*.json
fi
if [[ $steps == *all* || $steps == *bench* ]]; then
  # Issue 4's figures, each beside KvikIO and the machine's ceilings in the same run:
  # hot file -> GPU and GPU -> file at several thread counts, random-read latency,
  # hot file -> host memory, and cold file -> GPU.
  echo "== gdscp benchmark"
  (cd /tmp
   timeout 300 gdscp benchmark --size 4G --threads 4,8,16,32 --dir /tmp --json > "$OUT/bench-gpu.json" 2>"$OUT/bench-gpu.err"
   echo "gpu rc=$?"
   timeout 120 gdscp benchmark --size 4G --threads 16,32 --host --mode read --dir /tmp --json > "$OUT/bench-host.json" 2>"$OUT/bench-host.err"
   echo "host rc=$?"
   # the same with pread only, to show what the mapped streaming copy adds
   GDSCP_MAPPED_READS=0 timeout 120 gdscp benchmark --size 4G --threads 16 --host --mode read --dir /tmp --json > "$OUT/bench-host-pread.json" 2>"$OUT/bench-host-pread.err"
   echo "host (pread) rc=$?"
   timeout 150 gdscp benchmark --size 2G --threads 16 --mode read --drop-cache --dir /tmp --json > "$OUT/bench-cold.json" 2>"$OUT/bench-cold.err"
   echo "cold rc=$?")
  python3 scripts/bench_summary.py "$OUT"/bench-*.json | tee "$OUT/bench-summary.txt"
fi
exit $rc
