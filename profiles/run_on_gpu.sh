#!/usr/bin/env bash
# One GPU lease's work for issue 18: measure this device's profile (its timing group fitted on
# timing replays of profiles/calibration/), replay the bundled suite from prebuilt op lists,
# and hold the profile to that replay. Run from the repository root on the GPU machine:
#   bash profiles/run_on_gpu.sh NAME OUT_DIR
# writes OUT_DIR/NAME.json (profile), NAME-timing-calibration.json.gz (the calibration
# replays, for `calibrate --refit-timing`), NAME-run.log, and under OUT_DIR/cal the timing
# measurement (<date>-NAME-timing.json and its -replays.json.gz) and the predicted-vs-measured
# page, JSON and plot. The suite is measured in 15 interleaved rounds (each replays every
# run once) after a discarded warm-up round; the calibration workloads' timing replays are
# made in the same rounds (the timing group is fitted on those alone). About 2 minutes.
set -o pipefail
name=${1:?name}
out=${2:?out dir}
mkdir -p "$out/cal"
export PYTHONUNBUFFERED=1
{
  echo "== $(date -u +%FT%TZ) $(nvidia-smi -L 2>/dev/null | head -1)"
  echo "== host: $(nproc) CPUs for this process; $(grep -m1 'model name' /proc/cpuinfo)"
  grep MHz /proc/cpuinfo | awk '{print int($4/100)*100}' | sort | uniq -c | tr '\n' ' '; echo
  timeout 540 python3 -m overlap_harness calibrate --out "$out/$name.json" --runs 5 \
    --timing-suite scenarios --repeats 15 --report-out "$out/cal"
  echo "== calibrate exit $? at $(date -u +%FT%TZ)"
  grep MHz /proc/cpuinfo | awk '{print int($4/100)*100}' | sort | uniq -c | tr '\n' ' '; echo
} 2>&1 | tee "$out/$name-run.log"
