#!/usr/bin/env bash
# client/ctl/ckptctl.bash against a stand-in ckptctl that answers `ls` like the real one (a
# header row, then one row per job or step) and records the --socket it was given.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cat > "$TMP/ckptctl" <<'STUB'
#!/usr/bin/env bash
[ "$1" = --socket ] && { echo "$2" > "$(dirname "$0")/socket-seen"; shift 2; }
[ "$1" = ls ] || exit 2
if [ $# -eq 1 ]; then printf 'JOB OWNER CHECKPOINTS LATEST\nllama 0 3 300\nmistral 0 1 5\n'
else printf 'STEP STATE SIZE\n100 COMMITTED 1\n200 COMMITTED 1\n300 ABORTED 1\n'; fi
STUB
chmod +x "$TMP/ckptctl"
# shellcheck source=/dev/null
source "$ROOT/client/ctl/ckptctl.bash"
fail=0
check() {  # check "WORDS..." "expected replies (sorted, space-separated)"
  read -r -a COMP_WORDS <<< "$1"
  [[ "$1" == *" " ]] && COMP_WORDS+=("")
  COMP_WORDS[0]="$TMP/ckptctl"
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _ckptctl
  local got
  got="$(printf '%s\n' "${COMPREPLY[@]}" | LC_ALL=C sort | xargs)"
  if [ "$got" != "$2" ]; then echo "FAIL: '$1' -> '$got', want '$2'"; fail=1; else echo "ok: '$1'"; fi
}
check "ckptctl " "--help --json --socket abort du export gc inspect latest ls prefetch reshard rm status verify wait watch"
check "ckptctl st" "status"
check "ckptctl status " "llama mistral"
check "ckptctl status ll" "llama"
check "ckptctl status llama " "100 200 300"
check "ckptctl status llama 2" "200"
check "ckptctl export llama " "100 200 300 latest"
check "ckptctl latest llama " ""
check "ckptctl du " "llama mistral"
check "ckptctl du llama " ""
check "ckptctl watch " "llama mistral"
check "ckptctl watch llama " ""
check "ckptctl watch --" "--interval_ms --plain --until_idle"
check "ckptctl watch --interval_ms " ""
check "ckptctl wait llama 100 --until " "committed remote staged"
check "ckptctl wait llama 100 --" "--timeout_ms --until"
check "ckptctl export llama 100 --format " "safetensors"
check "ckptctl verify " "llama mistral"
check "ckptctl verify llama " "100 200 300 latest"
check "ckptctl verify llama latest --" "--sample --seed --tier --timeout_ms"
check "ckptctl verify llama latest --tier " "local peer ram remote"
check "ckptctl verify --tier ram llama " "100 200 300 latest"
check "ckptctl --json --socket /s/ck.sock inspect m" "mistral"
[ "$(cat "$TMP/socket-seen")" = /s/ck.sock ] || { echo "FAIL: --socket not passed to ls"; fail=1; }
mkdir -p "$TMP/out.d"
check "ckptctl export llama 100 $TMP/out" "$TMP/out.d"
exit $fail
