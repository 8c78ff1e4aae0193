#!/usr/bin/env bash
# Embedded mode, no Kafka: the demo corpus shipped in demo/ (LLVM documentation pages of two
# releases, RFCs 2821/2822 and the RFCs that rewrite them, a small WARC crawl) through
# `dupalign scan`; matches printed as a table.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${DUPALIGN_DEMO_DIR:-$here/var/demo-scan}
demo=$here/demo
rm -rf "$work/store"; mkdir -p "$work"
"$here/.venv/bin/dupalign" scan --store "$work/store" --out "$work/matches.jsonl" --progress \
  "$demo/llvm-docs" "$demo/rfc" "$demo/web/creativecommons.org.warc.gz"
"$here/.venv/bin/python" - "$work/matches.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
def short(doc_id: str, width: int = 36) -> str:
    return doc_id if len(doc_id) <= width else "…" + doc_id[-(width - 1):]
print(f"{'page':<36} {'kind':<8} {'matches':<36} {'est':>5} {'J':>5}  spans (tokens in page ~ tokens in match)")
for m in rows:
    spans = m.get("spans") or []
    shown = ", ".join(f"{s['tokens'][0]}-{s['tokens'][1]}~{s['match_tokens'][0]}-{s['match_tokens'][1]}"
                      for s in spans[:3]) + (f" (+{len(spans) - 3})" if len(spans) > 3 else "")
    jac = f"{m['jaccard']:5.2f}" if "jaccard" in m else f"{'-':>5}"
    print(f"{short(m['doc_id']):<36} {m['kind']:<8} {short(m['match_doc_id']):<36} "
          f"{m.get('est_jaccard', 0):5.2f} {jac}  {shown}")
kinds = {}
for m in rows:
    kinds[m["kind"]] = kinds.get(m["kind"], 0) + 1
print(f"\n{len(rows)} matches: {kinds}; full JSON in {sys.argv[1]}")
PY
