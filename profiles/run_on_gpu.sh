#!/usr/bin/env bash
# One GPU lease's work for issue 18: measure this device's profile, replay the suite, and hold
# the profile to the replay. Run from the repository root on the GPU machine:
#   bash profiles/run_on_gpu.sh NAME OUT_DIR
# writes OUT_DIR/NAME.json (profile), NAME-timelines.json.gz (calibration timelines, for
# `calibrate --refit`), NAME-run.log, and under OUT_DIR/suite the gpu-check report and the
# predicted-vs-measured page, JSON and plot. Time limits keep it under 8 minutes.
set -o pipefail
name=${1:?name}
out=${2:?out dir}
mkdir -p "$out/suite"
export PYTHONUNBUFFERED=1
{
  echo "== $(date -u +%FT%TZ) $(nvidia-smi -L 2>/dev/null | head -1)"
  echo "== calibrate"
  timeout 150 python3 -m overlap_harness.calibrate_cmd --out "$out/$name.json" \
    --timelines "$out/$name-timelines.json.gz"
  echo "== calibrate exit $? at $(date -u +%FT%TZ)"
  timeout 230 python3 -m overlap_harness gpu-check scenarios --trials 5 --baseline-trials 1 \
    --out "$out/suite" --deadline 150
  echo "== gpu-check exit $? at $(date -u +%FT%TZ)"
  for report in "$out"/suite/*-"$name".json "$out"/suite/*.json; do
    [ -f "$report" ] || continue
    case "$report" in *-vs-*) continue ;; esac
    timeout 50 python3 -m overlap_harness.calibrate_cmd --compare "$report" \
      --profile "$out/$name.json" scenarios --report-out "$out/suite"
    echo "== compare exit $? at $(date -u +%FT%TZ)"
    break
  done
} 2>&1 | tee "$out/$name-run.log"
