#!/usr/bin/env bash
# GPT-2 tokenizer throughput: `railyard data prepare --tokenizer gpt2` (C++, the whole command: read, tokenize, write
# llm.c shards) against gpt-3-encoder's JavaScript encoder under node (the package's own Encoder.js, the independent
# implementation the tests compare tokens with), on the same text, in alternating rounds.
#
# Usage: tests/bench/data/gpt2_tokenizer.sh BUILD_DIR [ROUNDS] [MB]
#   The corpus: MB megabytes (default 6) of the machine's own text, two thirds prose (licences, copyright files,
#   manuals) and one third Python source, built once under /tmp. The vocabulary: scripts/fetch_gpt2_vocab.sh's cache.
# Prints the load average before and after, each round's MB/s, the medians and the ratio's median and spread, and
# checks that both sides produced the same token count. Record only on a quiet machine (docs/benchmarks.md).
set -euo pipefail
build=${1:?usage: gpt2_tokenizer.sh BUILD_DIR [ROUNDS] [MB]}
rounds=${2:-5}
mb=${3:-6}
src=$(cd "$(dirname "$0")/../../.." && pwd)
vocab=${RAILYARD_GPT2_DIR:-$HOME/.cache/railyard/gpt2}
bash "$src/scripts/fetch_gpt2_vocab.sh" "$vocab"
work=$(mktemp -d /tmp/gpt2-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Corpus: prose first (licences, copyright files), then Python source, cut to size.
prose=$((mb * 1024 * 1024 * 2 / 3))
code=$((mb * 1024 * 1024 - prose))
# (head closes the pipe early: the writers' SIGPIPE is expected, hence no pipefail here)
(
  set +o pipefail
  { cat /usr/share/common-licenses/* /usr/share/doc/*/copyright 2>/dev/null; } | head -c "$prose" >"$work/prose.txt"
  find /usr/lib/python3* -name '*.py' -size +8k 2>/dev/null | sort | xargs cat 2>/dev/null | head -c "$code" \
    >"$work/code.txt"
)
# Valid UTF-8 without U+0085 and U+FEFF, where the two implementations legitimately differ (docs/data.md: node reads
# invalid bytes as U+FFFD, and JavaScript's \s disagrees with Unicode's White_Space on those two characters).
cat "$work/prose.txt" "$work/code.txt" | python3 -c '
import sys
t = sys.stdin.buffer.read().decode("utf-8", "ignore").replace("\x85", "").replace("\ufeff", "")
sys.stdout.buffer.write(t.encode())' >"$work/corpus.txt"
bytes=$(stat -c %s "$work/corpus.txt")

# node: gpt-3-encoder's encode() line by line (its cost grows faster than the text: 16 KB chunks took 1.6x as long, a
# whole 6 MB string far longer). The text is cut only before a newline that sits between two non-space characters,
# where GPT-2's pattern ends a piece anyway, so the pieces, hence the tokens, are those of the whole text (the token
# counts are compared below).
cat >"$work/js.js" <<'JS'
const fs = require("fs");
const { encode } = require(process.argv[2] + "/Encoder.js");
const text = fs.readFileSync(process.argv[3], "utf8");
const t0 = process.hrtime.bigint();
let n = 1;  // the <|endoftext|> that prepare puts in front of the document
for (const part of text.split(/(?<=\S)(?=\n\S)/)) n += encode(part).length;
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(JSON.stringify({ seconds: s, tokens: n }));
JS
ours() {
  local t0 t1 out
  rm -rf "$work/out"
  t0=$(date +%s.%N)
  out=$("$build/bin/railyard" data prepare --tokenizer gpt2 --vocab-dir "$vocab" --input "$work/corpus.txt" \
    --output "$work/out" --val-fraction 0 --shard-tokens 100000000)
  t1=$(date +%s.%N)
  tokens=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["inputs"][0]["tokens"])' "$work/out/prepare.json")
  echo "$(python3 -c "print($t1 - $t0)") $tokens"
}
js() {
  node "$work/js.js" "$vocab" "$work/corpus.txt" |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["seconds"], j["tokens"])'
}

echo "gpt2_tokenizer: $(date -u +%FT%TZ), $(nproc) CPUs, corpus $bytes bytes ($mb MB: prose + Python), $rounds rounds"
echo "load average before: $(cat /proc/loadavg)"
ours_s=() js_s=()
for r in $(seq 1 "$rounds"); do
  # Alternate which side goes first.
  if [ $((r % 2)) = 1 ]; then a=$(ours); b=$(js); else b=$(js); a=$(ours); fi
  read -r sa ta <<<"$a"
  read -r sb tb <<<"$b"
  [ "$ta" = "$tb" ] || { echo "FAIL: token counts differ: railyard $ta, gpt-3-encoder $tb" >&2; exit 1; }
  ours_s+=("$sa")
  js_s+=("$sb")
  echo "round $r: railyard $sa s ($(python3 -c "print(round($bytes / $sa / 1e6, 2))") MB/s), gpt-3-encoder $sb s ($(python3 -c "print(round($bytes / $sb / 1e6, 2))") MB/s), $ta tokens"
done
echo "load average after: $(cat /proc/loadavg)"
python3 - "$bytes" "${ours_s[*]}" "${js_s[*]}" <<'PY'
import statistics, sys
b = int(sys.argv[1])
ours = [float(x) for x in sys.argv[2].split()]
js = [float(x) for x in sys.argv[3].split()]
ratios = sorted(j / o for o, j in zip(ours, js))
print(f"median: railyard {b / statistics.median(ours) / 1e6:.1f} MB/s (whole command), "
      f"gpt-3-encoder {b / statistics.median(js) / 1e6:.2f} MB/s (encode only)")
print(f"ratio (gpt-3-encoder time / railyard time): median {statistics.median(ratios):.1f}, "
      f"min {ratios[0]:.1f}, max {ratios[-1]:.1f}")
PY
