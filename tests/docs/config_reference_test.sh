#!/usr/bin/env bash
# docs/CONFIGURATION.md holds the configuration reference verbatim as `ckptd --help-config`
# prints it from the options' declarations (daemon/src/options_table.cc), between the markers
# <!-- config-reference:begin --> and <!-- config-reference:end -->, so it cannot drift.
#   config_reference_test.sh CKPTD [README]            fails (with the diff) when they differ
#   config_reference_test.sh CKPTD [README] --update   rewrites the README's block (make docs)
set -euo pipefail
ckptd="$1"
readme="${2:-$(dirname "$0")/../../docs/CONFIGURATION.md}"
begin='<!-- config-reference:begin -->'
end='<!-- config-reference:end -->'
for m in "$begin" "$end"; do
  if [ "$(grep -cxF -- "$m" "$readme")" != 1 ]; then
    echo "config_reference_test: $readme must hold the line '$m' exactly once" >&2
    exit 1
  fi
done
want="$(mktemp)"
trap 'rm -f "$want" "$want.readme"' EXIT
"$ckptd" --help-config > "$want"
awk -v b="$begin" -v e="$end" '$0 == e {inside = 0} inside {print} $0 == b {inside = 1}' \
  "$readme" > "$want.readme"
if [ "${3:-}" = --update ]; then
  awk -v b="$begin" -v e="$end" -v f="$want" '
    $0 == b {print; while ((getline line < f) > 0) print line; skip = 1; next}
    $0 == e {skip = 0}
    !skip {print}' "$readme" > "$readme.new"
  mv "$readme.new" "$readme"
  echo "config_reference_test: $readme updated from ckptd --help-config"
  exit 0
fi
if ! diff -u --label "$readme (configuration reference)" --label "ckptd --help-config" \
    "$want.readme" "$want"; then
  echo "config_reference_test: README's configuration reference differs from ckptd --help-config;" \
    "run: make docs" >&2
  exit 1
fi
echo "config_reference_test: README matches ckptd --help-config ($(wc -l < "$want") lines)"
