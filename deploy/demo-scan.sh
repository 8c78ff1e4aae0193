#!/usr/bin/env bash
# Embedded mode, no Kafka: the Clough & Stevenson plagiarism corpus (5 Wikipedia originals,
# then 95 student answers) and RFC 2821 → 5321 through `dupalign scan`; matches printed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
shared=${DUPALIGN_SHARED:-$here/../shared}
work=${DUPALIGN_DEMO_DIR:-$here/var/demo-scan}
rm -rf "$work/store"; mkdir -p "$work"
clough=$shared/testdata/clough
"$here/.venv/bin/dupalign" scan --store "$work/store" --out "$work/matches.jsonl" --progress \
  "$clough"/orig_task*.txt "$clough"/g*.txt \
  "$shared/testdata/rfc/rfc2821.txt" "$shared/testdata/rfc/rfc5321.txt"
"$here/.venv/bin/python" - "$work/matches.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"{'page':<22} {'kind':<8} {'matches':<22} {'est':>5} {'J':>5}  spans (tokens in page ~ tokens in match)")
for m in rows:
    spans = m.get("spans") or []
    shown = ", ".join(f"{s['tokens'][0]}-{s['tokens'][1]}~{s['match_tokens'][0]}-{s['match_tokens'][1]}"
                      for s in spans[:3]) + (f" (+{len(spans) - 3})" if len(spans) > 3 else "")
    jac = f"{m['jaccard']:5.2f}" if "jaccard" in m else f"{'-':>5}"
    print(f"{m['doc_id']:<22} {m['kind']:<8} {m['match_doc_id']:<22} {m.get('est_jaccard', 0):5.2f} {jac}  {shown}")
kinds = {}
for m in rows:
    kinds[m["kind"]] = kinds.get(m["kind"], 0) + 1
print(f"\n{len(rows)} matches: {kinds}; full JSON in {sys.argv[1]}")
PY
