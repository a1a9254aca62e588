#!/usr/bin/env bash
# report_render: `railyard report` from a real short training run (tiny model, checkpoints every 4 steps, then a
# restart that resumes from the step-8 checkpoint and replays steps 9..12), rendered by headless Chromium: the
# screenshot is not blank and each chart's line is drawn. Also the text-log input and refused inputs. No cluster.
# Without chromium (scripts/install-deps.sh installs it) the test exits 77, which CTest reports as skipped.
set -euo pipefail
NEED_MINIHELM=0 source "$(dirname "$0")/lib.sh"

for b in railyard railyard-worker; do [ -x "$bin/$b" ] || fail "$bin/$b is missing: build the $b target"; done
cd "$work"
"$bin/railyard" data prepare --input /usr/share/common-licenses/GPL-3 --output data >/dev/null 2>prepare.err ||
  fail "railyard data prepare: $(cat prepare.err)"
train() { # STEPS: the same run; appends to run.jsonl, text log to run.txt
  "$bin/railyard-worker" train --model l=2,c=64,nh=4,t=64,v=256 --data data --steps "$1" --batch 4 --seq 32 \
    --lr 3e-3 --val-every 4 --val-steps 2 --threads 1 --ckpt-dir ckpt --ckpt-every 4 --ckpt-async off \
    --ckpt-keep 5 --resume auto --sample-every 6 --sample-tokens 24 --log-json run.jsonl 2>>run.txt
}
train 12 || fail "training run 1 failed: $(tail -5 run.txt)"
# A restart from the step-8 checkpoint: the newest one (step 12) is gone, so the run replays steps 9..12.
rm -rf ckpt/step-00000012
train 12 || fail "training run 2 (resume) failed: $(tail -5 run.txt)"
check "the run logged 16 steps (12, then 9..12 again)" test "$(grep -c '"event":"step"' run.jsonl)" = 16

"$bin/railyard" report --log run.jsonl --checkpoints ckpt --title "tiny run" --output report.html >report.out ||
  fail "railyard report failed"
check "report prints the path it wrote" grep -q "report: wrote $work/report.html" report.out
has() { grep -q -- "$1" report.html || { echo "  report.html lacks: $1" >&2; return 1; }; }
check "self-contained: no script, no external URL, no link/img" bash -c \
  '! grep -Eiq "<script|<link|<img|(src|href)=\"?https?:|url\(" report.html'
check "four line charts with drawn paths" test "$(grep -c '<path fill="none" stroke="#' report.html)" -ge 4
for id in chart-loss chart-tokens chart-step-time chart-mfu chart-split segments checkpoints; do
  check "report has #$id" has "id=\"$id\""
done
check "the restart is found: the second segment replays steps 9..12" \
  has "<td>2</td><td>restart (step went back from 12 to 9)</td><td>9</td><td>12</td><td>4</td>"
check "steps card shows 12" bash -c "grep -A1 'id=\"card-steps\"' report.html | grep -q '>12<'"
check "restarts card shows 1" bash -c "grep -A1 'id=\"card-restarts\"' report.html | grep -q '>1<'"
check "validation loss dots (4 validations per run: steps 0, 4, 8, 12 and 8, 12)" \
  test "$(grep -c '<circle' report.html)" -ge 5
check "checkpoint table lists steps 4 and 8 and the replayed 12" bash -c \
  "grep -A4 'id=\"checkpoints\"' report.html | tr -d '\n' | grep -Eq '<td>4</td><td>complete.*<td>8</td><td>complete.*<td>12</td><td>complete'"

# The text log (what `kubectl logs` shows) gives the same steps; the restore line starts the second segment.
"$bin/railyard" report --log run.txt --output text.html >/dev/null || fail "railyard report --log run.txt failed"
check "text log: 12 steps, then the restore of step 8 starts a segment of steps 9..12" bash -c \
  "grep -q '<td>1</td><td>start</td><td>1</td><td>12</td><td>12</td>' text.html &&
   grep -q '<td>2</td><td>restored checkpoint step 8</td><td>9</td><td>12</td><td>4</td>' text.html"

# Text samples (--sample-every 6): steps 6 and 12, and 12 again after the restart, in both logs, the same text.
samples_of() { # HTML: "step<TAB>text" per row of the samples table
  python3 - "$1" <<'PY'
import html, re, sys
t = open(sys.argv[1]).read()
m = re.search(r'<table id="samples">(.*?)</table>', t, re.S)
for step, text in re.findall(r"<tr><td>(\d+)</td><td><pre>(.*?)</pre></td></tr>", m.group(1) if m else "", re.S):
    print(step + "\t" + html.unescape(text).replace("\n", "\\n"))
PY
}
check "samples: 3 in the JSON log" test "$(grep -c '"event":"sample"' run.jsonl)" = 3
check "report: the samples table has steps 6, 12, 12" test "$(samples_of report.html | cut -f1 | tr '\n' ' ')" = "6 12 12 "
check "the text log's samples are the JSON log's" test "$(samples_of report.html)" = "$(samples_of text.html)"
# Seeded by --seed and the step, from the same weights: the replayed step 12 (resumed from the step-8 checkpoint)
# draws the first run's step-12 text again.
check "the restart's step-12 sample is the first run's" test "$(samples_of report.html | grep -c "^12")" = 2 -a \
  "$(samples_of report.html | grep "^12" | sort -u | wc -l)" = 1
check "the samples are not empty" test "$(samples_of report.html | cut -f2 | awk 'length($0) >= 20' | wc -l)" = 3

# Refused inputs name the file and the fix.
refuses() { # WANT-REGEX ARGS...: exit code 1 or 2 and stderr matching
  local want=$1 rc=0
  shift
  "$bin/railyard" report "$@" --output bad.html >/dev/null 2>err.txt || rc=$?
  [ "$rc" -ne 0 ] && grep -Eq -- "$want" err.txt || { echo "  rc=$rc: $(cat err.txt)" >&2; return 1; }
}
echo '{"kind":"Pod"}' >pod.json
echo '{"event":"step","step":1,' >junk.jsonl
check "no --log" refuses '--log FILE is required'
check "a log without steps" refuses 'prepare.err: no training steps found' --log prepare.err
check "a malformed JSON line" refuses 'junk.jsonl:1: not a JSON object' --log junk.jsonl
check "a status that is not a TrainingJob" refuses "pod.json: kind is 'Pod', expected a TrainingJob" \
  --log run.jsonl --status pod.json
check "a missing checkpoint directory" refuses 'nope: not a directory' --log run.jsonl --checkpoints nope
check "no page written for refused input" test ! -e bad.html

# --status with a goodput ledger (status.goodput, as the operator writes it): a table on the page and the same lines
# on stdout, in common/goodput.h's order, causes without time left out, shares of the summed wall time.
cat >tj.json <<'EOF'
{"kind": "TrainingJob", "metadata": {"namespace": "team-a", "name": "tiny"},
 "status": {"phase": "Succeeded", "restarts": 1,
  "goodput": {"wallSeconds": 40, "since": "2026-12-06T10:00:40.000000Z", "state": "ended", "ratio": 0.7,
   "seconds": {"training": 28, "recomputing": 2, "detection": 1, "scheduling": 6, "waitingForCapacity": 0,
               "rendezvousAndInit": 3, "initializing": 0, "suspended": 0, "invalid": 0}}}}
EOF
"$bin/railyard" report --log run.jsonl --status tj.json --output ledger.html >ledger.out || fail "report --status failed"
check "the ledger's lines on stdout: wall, then training 70 %, detection 2.5 %" bash -c \
  "grep -q 'where the time went (status.goodput, as of 2026-12-06T10:00:40.000000Z): 40.0 s' ledger.out &&
   grep -Eq '^  training +28.0 s  70.0 %' ledger.out && grep -Eq '^  detection +1.0 s   2.5 %' ledger.out"
check "causes in order, none without time" test "$(awk '/^  /{print $1}' ledger.out | tr '\n' ' ')" = \
  "training recomputing detection scheduling rendezvousAndInit "
check "the page has the ledger table" bash -c "grep -q 'id=\"goodput\"' ledger.html &&
   grep -q '<td>recomputing</td><td>2.0</td><td>5.0 %</td>' ledger.html"
check "no ledger, no lines" bash -c "! grep -q 'where the time went' report.out"

# --- headless Chromium ---------------------------------------------------------------------------------------------
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "SKIP: chromium is not installed (scripts/install-deps.sh installs Debian's chromium): the rendering of the" \
    "report was not checked" >&2
  rm -rf "$work"
  exit 77
fi
[ "$failures" -eq 0 ] || fail "$failures check(s) failed before rendering"
mkdir profile
# Nothing to fetch: the page is self-contained; the flags keep Chromium off the network and out of $HOME.
timeout 90 "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync --disable-extensions \
  --user-data-dir="$work/profile" --hide-scrollbars --window-size=1000,1500 --screenshot="$work/shot.png" \
  "file://$work/report.html" >chromium.log 2>&1 || fail "chromium failed: $(tail -5 chromium.log)"
[ -s shot.png ] || fail "chromium wrote no screenshot: $(tail -5 chromium.log)"
# The loss, tokens/s and step-time lines (colours in cli/report.cc) each drawn across most of a chart.
check "screenshot not blank; loss, tokens/s, step-time lines drawn" \
  python3 "$src/tests/e2e/install/png_check.py" shot.png 400 500 '#1f77b4' '#9467bd' '#8c564b'
if [ -n "${RAILYARD_REPORT_KEEP:-}" ]; then cp report.html shot.png "$RAILYARD_REPORT_KEEP/"; fi
finish
