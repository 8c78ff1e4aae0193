"""The passage query on one thread, for text that is not indexed (``Engine.query_text``):
the three stages' passage parts composed, as ``Engine.process`` runs them for a page
(sketch: ``PassageSketcher``, index: ``PassageIndex.find_tasks``, align: ``Aligner``), with
nothing written.
"""

from __future__ import annotations

from dupalign.match import Span
from dupalign.passage.index import PassageIndex
from dupalign.passage.positions import unpack_positions
from dupalign.passage.sketch import I64, U64, PassageSketcher, PassageState
from dupalign.passage.tasks import Tasks
from dupalign.stages.align import Aligner, Hit, spans_of_hits
from dupalign.text.tokens import Tokens


class PassageQuery:
    def __init__(self, sketcher: PassageSketcher, index: PassageIndex, aligner: Aligner) -> None:
        self.sketcher, self.index, self.aligner = sketcher, index, aligner

    def search(
        self, hashes: U64, tokens: Tokens, ordinal: int, exclude: frozenset[int] = frozenset()
    ) -> tuple[list[tuple[int, list[Span]]], PassageState]:
        """Spans of this page copied from pages before ``ordinal``, per earlier page; pages
        in ``exclude`` (already matched as near duplicates) are not aligned."""
        state = self.sketcher.sketch_page(hashes, tokens)
        hits = self.align_state(state, ordinal, exclude)
        units = None if state.positions is None else unpack_positions(state.positions)[2]
        return (spans_of_hits(self.aligner.spans, hits, state.starts, state.ends, tokens,
                              units), state)

    def align_state(
        self, state: PassageState, before: int, exclude: frozenset[int] = frozenset()
    ) -> list[Hit]:
        """``(passage, page, start, end, estimate)`` of ``state``'s passages (see
        ``align_passages``)."""
        if state.rects is None:
            return []
        return self._align(self.index.find_tasks(state, before, exclude))

    def align_passages(
        self, units: U64, starts: I64, ends: I64, before: int,
        exclude: frozenset[int] = frozenset(),
    ) -> list[Hit]:
        """Align the passages ``units[starts[p]:ends[p]]`` against the pages before
        ``before``: ``(passage, page, start, end, estimate)`` for every longest range
        ``[start, end)`` of the page's units whose estimate is ≥ θ (dupalign.passage.batch_align
        has the steps)."""
        keys, empty = self.sketcher.sketches(units, starts, ends)
        state = PassageState(None, len(units), b"", starts, ends, keys, empty)
        return self._align(self.index.find_tasks(state, before, exclude))

    def _align(self, t: Tasks | None) -> list[Hit]:
        if t is None:
            return []
        h_t, h_s, h_e, h_x = self.aligner.scan(t.gather(self.index.read_forward))
        return list(zip(t.t_p[h_t].tolist(), t.t_o[h_t].tolist(), h_s.tolist(), h_e.tolist(),
                        h_x.tolist(), strict=True))
