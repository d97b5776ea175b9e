"""Steps that append several tokens to a request: jump forward over what its grammar
forces (`jump`), and drafts confirmed by the model (`verify_drafts`).

The runner needs nothing special for a jump: the next forward pass feeds a row every
known token it has not seen yet (`runners.base.ForwardBatch`), so the jumped tokens go
in at once, beside the sampled one. Drafts go into the same pass after a row's known
tokens, and the pass gives the row's logits after each of them.

A draft is checked position by position, the rows of the batch together: the row's
guide takes the tokens confirmed so far (so the reasoning tracker decides where the
thinking ends, and from there the grammar's mask applies at every position), the step's
constraints are gathered as for any step, and the sampler chooses a token from the
logits at that position with the row's settings and its next uniform draw. A draft
token is kept only where the sampler chose it. That is the speculative rule for a
deterministic draft: it is kept with probability p(draft) under the row's masked,
processed distribution (with greedy decoding: where it is the argmax), and where it is
not, the token chosen instead is a draw from that distribution without the draft, the
residual. So the output is distributed exactly as without drafts (with a seeded request
whose model gives the same logits, it is the same output), a token the grammar rejects
is never kept, and nothing a rejected draft did needs undoing in the guide, which only
ever sees kept tokens. The runner forgets the positions of the rejected drafts
(`ModelRunner.rollback`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from structured_output.jump_forward import ForcedTokens

from .request import EngineRequest, Status

if TYPE_CHECKING:
    from .engine import EngineCore


def jump(r: EngineRequest, forced: ForcedTokens) -> int:
    """After ``r`` took its sampled token (not its last): when its answer is under a
    grammar, feed that token to its guide now, then append the tokens the grammar
    forces after it (each fed to the guide as if sampled, never past ``max_tokens``).
    Returns how many were appended. A request that asked for log-probabilities is
    left alone (a jumped token has none)."""
    g = r.guide
    if g is None or r.logprobs is not None or not g.can_jump:
        return 0
    tok, r.pending = r.pending, None
    if tok is not None:
        g.accept(tok, r.output_ids)
    ids = g.jump_forward(forced, r.max_tokens - len(r.output_ids))
    r.output_ids += ids
    return len(ids)


def jump_at_start(r: EngineRequest, forced: ForcedTokens) -> int:
    """``r`` joins the batch with its answer already begun under a grammar (nothing to
    think first, or the thinking ended in the prompt): the tokens its grammar forces
    before the first choice are appended now, so that the first forward pass takes
    them with the prompt instead of sampling them one pass each. One token is always
    left to sample. Returns how many were appended (none for a request that asked for
    log-probabilities)."""
    g = r.guide
    if g is None or r.logprobs is not None or not g.can_jump:
        return 0
    ids = g.jump_forward(forced, r.max_tokens - len(r.output_ids) - 1)
    r.output_ids += ids
    return len(ids)


def gather_rows(
    logits: torch.Tensor, at: np.ndarray, buf: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``at`` of ``logits``, copied into ``buf`` (grown when too small; the
    sampler edits them in place); returns the copy and the buffer to keep."""
    n = len(at)
    if (
        buf is None
        or buf.shape[0] < n
        or buf.shape[1] != logits.shape[1]
        or buf.dtype != logits.dtype
        or buf.device != logits.device
    ):
        buf = torch.empty(
            (max(n, logits.shape[0]), logits.shape[1]), dtype=logits.dtype, device=logits.device
        )
    out = buf[:n]
    torch.index_select(logits, 0, torch.from_numpy(at).to(logits.device), out=out)
    return out, buf


def verify_drafts(
    core: EngineCore,
    batch: list[EngineRequest],
    drafts: list[list[int]],
    tokens: np.ndarray,
    live: list[bool],
    logits: torch.Tensor,
    blocks: list[np.ndarray],
) -> None:
    """Commit a step whose rows had ``drafts``: ``tokens`` are the tokens sampled after
    each row's known tokens; ``logits`` holds, after those rows, block ``j`` of the
    rows ``blocks[j]`` after their draft token ``j - 1`` (`runners.base.ForwardBatch`).
    Each row appends its confirmed drafts and the token sampled where its draft was
    rejected or ran out, stopping where a token ends it (a stop token, ``max_tokens``),
    then reports once. Where every row of a block is still going, its logits are
    sampled in place; else the going rows' are gathered."""
    rows = list(range(len(batch)))  # the batch rows sampled at position j
    start = len(batch)  # the first logits row of block j + 1
    j = 0
    while True:
        going: list[int] = []
        for a, i in enumerate(rows):
            r = batch[i]
            if (j == 0 and not live[i]) or r.status == Status.FINISHED:
                continue
            try:
                tok = int(tokens[a])
                if not core._append(r, tok):
                    continue
                d = drafts[i]
                if j < len(d) and tok == d[j]:
                    core.num_accepted_drafts += 1
                    going.append(i)
                    continue
                if len(d) > j:
                    core.runner.rollback(r, len(d) - j)
                core._report(r)
            except Exception as e:  # noqa: BLE001 - ends this request only
                core._fail(r, e, "taking its sampled token")
        if not going:
            return
        j += 1
        rows, block = going, blocks[j]  # going rows are among block's, both ascending
        sub = [batch[i] for i in rows]
        cons, sub_live = core._prepare(sub)  # the guides take the confirmed drafts
        sb = core._sampling_batch(sub)
        if len(rows) == len(block):
            x = logits[start : start + len(block)]
        else:
            at = start + np.searchsorted(block, rows)
            x, core._draft_rows = gather_rows(logits, at, core._draft_rows)
        start += len(block)
        tokens = core._sample(x, sb, cons, sub, sub_live)
