"""Steps that append several tokens to a request: jump forward over what its grammar
forces (`jump`).

The runner needs nothing special for a jump: the next forward pass feeds a row every
known token it has not seen yet (`runners.base.ForwardBatch`), so the jumped tokens go
in at once, beside the sampled one.
"""

from __future__ import annotations

from structured_output.jump_forward import ForcedTokens

from .request import EngineRequest


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
