#!/usr/bin/env bash
# Checks gdscp on a GPU machine: builds it, then runs the named steps. Logs
# and JSON go to $OUT (default ./device-out).
#
#   bash scripts/device_check.sh [tests] [bench] [many] [probes] [sweep] [multi] [mpi]    (default: tests)
#
# tests and bench each take six to nine minutes on an H200 machine with 16 vCPUs
# (tests spread over processes: pytest-xdist and execnet wheels in .whl/).
#
#   tests  the whole test suite with GDSCP_REQUIRE_GPU=1 (a missing GPU fails)
#   bench  the figures in docs/performance.md: gdscp benchmark --json, 6 runs,
#          then scripts/bench_summary.py
#   many   the many-files workloads: 2,000 files of 1 MiB and 20,000 of 64 KiB read
#          into the GPU (gdscp's bulk read against per-file loops, KvikIO's too),
#          and a tree of 5,000 files of 1-64 KiB copied (gdscp copy -r against cp -r + sync)
#   probes scripts/read_probes.py: short hot reads into the GPU by handle, path and
#          staging size, and fresh host buffers with the huge pages they got -> probes.json
#   sweep  scripts/gpu_sweep.py, the settings grid behind the defaults
#   multi  two or more GPUs: the multi-GPU tests (tests/test_multi_gpu.py, the
#          stand-in scenarios and the real two-GPU test), then
#          gdscp benchmark --devices all --size 4G --json (distinct hot files into
#          the GPUs, one file replicated against one GPU, with the host-side and
#          aggregate PCIe ceilings and the target ratios) -> multi.json
#   mpi    two hot 4 GiB files read into GPU memory: one process on GPU 0, against
#          mpiexec -n 2 (each rank on its node-local GPU, one file each), 3 runs each;
#          needs mpi4py and an MPI runtime: the system's, or the mpi4py and mpich wheels
#          in .whl/ (installed into a venv beside the system's packages: the mpich
#          wheel's library and mpiexec need a prefix of their own)
#
# KvikIO wheels placed in .whl/ (e.g. kvikio-cu13 and libkvikio-cu13) are
# installed to /tmp/site, so that the benchmark measures KvikIO beside gdscp;
# so are wheels of gdscp's own requirements where the machine's versions fall
# outside pyproject.toml's ranges (the build step names any such package).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
OUT=${OUT:-$repo/device-out}
mkdir -p "$OUT"
steps=" ${*:-tests} "
for step in $steps; do
  [[ $step == tests || $step == bench || $step == many || $step == probes || $step == sweep || $step == multi \
     || $step == mpi ]] || { echo "unknown step: $step (tests, bench, many, probes, sweep, multi, mpi)" >&2; exit 2; }
done
export PYTHONUNBUFFERED=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda-13.0}

# Each step has a timeout; BUDGET caps the seconds of all of them together
# (every step's timeout is cut to what is left), so that a slow step cannot
# hold up the rest for long. What finished is already in $OUT.
BUDGET=${BUDGET:-580}
start=$(date +%s)
limit() {
  local left=$(( BUDGET - ($(date +%s) - start) ))
  (( left < 1 )) && left=1
  echo $(( $1 < left ? $1 : left ))
}
rc=0

if ls .whl/*.whl >/dev/null 2>&1; then
  # (mpi4py and mpich go to the mpi step's own venv: mpich needs a prefix of its own.)
  wheels=$(ls .whl/*.whl | grep -v -e /mpi4py- -e /mpich-)
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site $wheels && export PYTHONPATH=/tmp/site
fi

echo "== build"
# --no-build-isolation: the machine has no network; the build requirements are installed.
python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start ))s"
# --no-deps took the machine's packages as they are: say which of gdscp's
# requirements they miss (a wheel of the right version in .whl/ fixes it).
python3 - <<'PY'
from importlib.metadata import PackageNotFoundError, requires, version
from packaging.requirements import Requirement
for text in requires("gdscp") or []:
    req = Requirement(text)
    if req.marker and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = version(req.name)
    except PackageNotFoundError:
        have = None
    if have is None or not req.specifier.contains(have, prereleases=True):
        print(f"warning: gdscp needs {req}, this machine has {req.name} {have or 'missing'}; "
              f"put a wheel of a matching version in .whl/")
PY

# Everything below runs from /tmp so that `import gdscp` finds the installed
# package, not the source tree (which has no compiled engine).
cd /tmp
gdscp info /tmp 2>&1 | tee "$OUT/info.txt"

if [[ $steps == *" tests "* ]]; then
  echo "== tests"
  # One line per test as it ends (-v): a run cut short by the timeout still
  # names every test that failed before it. With pytest-xdist importable (its
  # wheels and execnet's in .whl/), the suite is spread over TEST_WORKERS
  # processes (default 4), which a serial run needs to end within the step's
  # time, and the tests marked "alone" run after them, one at a time.
  if python3 -c "import xdist" 2>/dev/null; then
    GDSCP_REQUIRE_GPU=1 timeout "$(limit 540)" python3 -m pytest -v -rs -p no:cacheprovider --durations=40 \
      -n "${TEST_WORKERS:-4}" -m "not alone" "$repo/tests" >"$OUT/tests.log" 2>&1 || rc=1
    GDSCP_REQUIRE_GPU=1 timeout "$(limit 120)" python3 -m pytest -v -rs -p no:cacheprovider -m alone "$repo/tests" \
      >>"$OUT/tests.log" 2>&1 || rc=1
  else
    GDSCP_REQUIRE_GPU=1 timeout "$(limit 540)" python3 -m pytest -v -rs -p no:cacheprovider --durations=40 "$repo/tests" \
      >"$OUT/tests.log" 2>&1 || rc=1
  fi
  grep -E "^(FAILED|ERROR)| (FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -30
fi

if [[ $steps == *" bench "* ]]; then
  echo "== bench"
  # Each run measures gdscp, KvikIO (when importable) and the machine's ceilings,
  # interleaved run by run. Hot reads, writes and random reads into the GPU:
  timeout "$(limit 260)" gdscp benchmark --size 4G --threads 8,16,32 --dir /tmp --json \
    >"$OUT/bench-gpu.json" 2>"$OUT/bench-gpu.err" || rc=1
  # Shorter hot reads into the GPU, where a request's fixed start and finish
  # costs weigh more:
  timeout "$(limit 40)" gdscp benchmark --size 1G --threads 16 --mode read --dir /tmp --json \
    >"$OUT/bench-gpu-1g.json" 2>"$OUT/bench-gpu-1g.err" || rc=1
  timeout "$(limit 30)" gdscp benchmark --size 256M --threads 16 --mode read --dir /tmp --json \
    >"$OUT/bench-gpu-256m.json" 2>"$OUT/bench-gpu-256m.err" || rc=1
  # Hot reads into host memory, into a touched buffer and into a fresh
  # numpy.empty each run:
  timeout "$(limit 75)" gdscp benchmark --size 4G --threads 16,32 --host --mode read --dir /tmp --json \
    >"$OUT/bench-host.json" 2>"$OUT/bench-host.err" || rc=1
  # 4 KiB random reads into host memory against a bare os.preadv:
  timeout "$(limit 30)" gdscp benchmark --size 1G --threads 16 --host --mode randread --io-size 4K --ops 5000 \
    --dir /tmp --json >"$OUT/bench-host-random.json" 2>"$OUT/bench-host-random.err" || rc=1
  # Cold reads: the page cache is dropped before every run.
  timeout "$(limit 60)" gdscp benchmark --size 2G --threads 16 --mode read --drop-cache --dir /tmp --json \
    >"$OUT/bench-cold.json" 2>"$OUT/bench-cold.err" || rc=1
  python3 "$repo/scripts/bench_summary.py" "$OUT"/bench-{gpu,gpu-1g,gpu-256m,host,host-random,cold}.json \
    | tee "$OUT/bench-summary.txt"
fi

if [[ $steps == *" many "* ]]; then
  echo "== many"
  timeout "$(limit 150)" gdscp benchmark --files 2000 --file-size 1M --mode read --dir /tmp --json \
    >"$OUT/many-2000x1m.json" 2>"$OUT/many-2000x1m.err" || rc=1
  timeout "$(limit 150)" gdscp benchmark --files 20000 --file-size 64K --mode read --dir /tmp --json \
    >"$OUT/many-20000x64k.json" 2>"$OUT/many-20000x64k.err" || rc=1
  timeout "$(limit 120)" gdscp benchmark --files 5000 --file-size 1K-64K --mode copy --dir /tmp --json \
    >"$OUT/many-5000-tree.json" 2>"$OUT/many-5000-tree.err" || rc=1
  for f in "$OUT"/many-*.json; do echo "$(basename "$f"): $(wc -c <"$f") bytes"; tail -2 "${f%.json}.err"; done
fi

if [[ $steps == *" probes "* ]]; then
  echo "== probes"
  timeout "$(limit 150)" python3 "$repo/scripts/read_probes.py" "$OUT/probes.json" --dir /tmp || rc=1
fi

if [[ $steps == *" sweep "* ]]; then
  echo "== sweep"
  timeout "$(limit 300)" python3 "$repo/scripts/gpu_sweep.py" "$OUT/sweep.json" --dir /tmp \
    >"$OUT/sweep.log" 2>&1 || rc=1
  tail -40 "$OUT/sweep.log"
fi

if [[ $steps == *" multi "* ]]; then
  echo "== multi"
  GDSCP_REQUIRE_GPU=1 GDSCP_REQUIRE_STANDIN=1 timeout "$(limit 120)" python3 -m pytest -q -p no:cacheprovider \
    "$repo/tests/test_multi_gpu.py" >"$OUT/multi-tests.log" 2>&1 || rc=1
  grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/multi-tests.log" | tail -15
  timeout "$(limit 300)" gdscp benchmark --devices all --size 4G --dir /tmp --json \
    >"$OUT/multi.json" 2>"$OUT/multi.err" || rc=1
  python3 - "$OUT/multi.json" <<'PY' | tee "$OUT/multi-summary.txt"
import json, sys
doc = json.load(open(sys.argv[1]))
r = doc["ratios"]
print(f"devices {doc['devices']}, files of {doc['file_size'] >> 20} MiB, numa {doc['machine'].get('numa')}")
for name, c in doc["ceilings"].items():
    print(f"  {name:18} {c['gb_per_s']['median'] if c.get('available') else '-':>8} GB/s  {c.get('what') or c.get('reason')}")
print(f"  bound min(host side, aggregate PCIe) = {r['bound_gb_per_s']} GB/s")
print(f"  both at once: page-cache reads {r['host_side_while_copying_gb_per_s']} GB/s while the GPUs copy "
      f"{r['copies_while_reading_gb_per_s']} GB/s")
for t, q in r["by_threads"].items():
    res = doc["results"][t]
    med = {k: v["gb_per_s"]["median"] for k, v in res.items()}
    print(f"  threads {t}: {med}; distinct {q['distinct_share_of_bound']:.2f} of bound (>= 0.9: "
          f"{q['distinct_meets_target']}), replicate {q['replicate_over_one_gpu']:.2f}x one GPU (<= 1.15: "
          f"{q['replicate_meets_target']})")
PY
fi

if [[ $steps == *" mpi "* ]]; then
  echo "== mpi"
  # Open MPI's mpiexec refuses root without these (this script runs as root there); MPICH ignores them.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  py=$(command -v python3)
  mpiexec=$(command -v mpiexec || true)
  # Open MPI on a machine without ssh: ranks on this machine need no remote agent.
  export OMPI_MCA_plm='^rsh'
  if ! { [[ -n $mpiexec ]] && python3 -c "from mpi4py import MPI" 2>/dev/null; } \
      && ls "$repo"/.whl/mpi4py-*.whl "$repo"/.whl/mpich-*.whl >/dev/null 2>&1; then
    python3 -m venv --system-site-packages /tmp/gdscp-mpi-venv \
      && /tmp/gdscp-mpi-venv/bin/pip install -q --no-index --no-deps "$repo"/.whl/mpi4py-*.whl "$repo"/.whl/mpich-*.whl
    py=/tmp/gdscp-mpi-venv/bin/python mpiexec=/tmp/gdscp-mpi-venv/bin/mpiexec
  fi
  if [[ -z $mpiexec ]] || ! "$py" -c "from mpi4py import MPI" 2>/dev/null; then
    echo "mpi: no mpiexec or mpi4py here; place the mpi4py and mpich wheels in .whl/" | tee "$OUT/mpi.log"
    rc=1
  else
    "$py" -m mpi4py --mpi-lib-version 2>&1 | head -1 | tee "$OUT/mpi.log"
    # Open MPI binds each of two ranks to one core; their workers need the node's cores.
    bind=()
    grep -q "Open MPI" "$OUT/mpi.log" && bind=(--bind-to none)
    for f in a b; do gdscp write /tmp/mpi-$f.bin --size 4G --host -q && cat /tmp/mpi-$f.bin >/dev/null; done
    for run in 1 2 3; do
      timeout "$(limit 60)" "$py" -m gdscp read /tmp/mpi-a.bin /tmp/mpi-b.bin --device 0 --json \
        >"$OUT/mpi-one-$run.json" 2>>"$OUT/mpi.err" || rc=1
      timeout "$(limit 60)" "$mpiexec" "${bind[@]}" -n 2 "$py" -m gdscp read /tmp/mpi-a.bin /tmp/mpi-b.bin --json \
        >"$OUT/mpi-two-$run.json" 2>>"$OUT/mpi.err" || rc=1
    done
    # The tests of tests/test_mpi.py on this machine, with the GPU (each rank on its own GPU).
    GDSCP_REQUIRE_MPI=1 timeout "$(limit 120)" "$py" -m pytest -q -p no:cacheprovider "$repo/tests/test_mpi.py" \
      >"$OUT/mpi-tests.log" 2>&1 || rc=1
    tail -3 "$OUT/mpi-tests.log"
    python3 - "$OUT" <<'PY' | tee "$OUT/mpi-summary.txt"
import glob, json, statistics, sys
for kind in ("one", "two"):
    docs = [json.load(open(p)) for p in sorted(glob.glob(f"{sys.argv[1]}/mpi-{kind}-*.json"))]
    rates = [d["gb_per_s"] for d in docs if d.get("ok")]
    what = "1 process, GPU 0" if kind == "one" else "mpiexec -n 2, a GPU per rank"
    print(f"{what}: 2 hot 4 GiB files, GB/s per run {rates}, median {statistics.median(rates) if rates else '-'}")
PY
    rm -f /tmp/mpi-a.bin /tmp/mpi-b.bin
  fi
fi

echo "== done in $(( $(date +%s) - start ))s, rc=$rc"
exit $rc
