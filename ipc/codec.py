"""Encoding and decoding of frames. One `Codec` per thread (msgspec encoders and
decoders are built once and are not shared across threads)."""

from __future__ import annotations

from typing import Any

import msgspec

from .messages import MESSAGE_TYPES, TYPE_OF, MsgType


class WireError(ValueError):
    """A frame that cannot be used. ``request_id`` is set when the frame was a
    request whose id could still be read."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class Codec:
    __slots__ = ("_enc", "_decoders", "_raw")

    def __init__(self) -> None:
        self._enc = msgspec.msgpack.Encoder()
        self._decoders = {t: msgspec.msgpack.Decoder(cls) for t, cls in MESSAGE_TYPES.items()}
        self._raw = msgspec.msgpack.Decoder()

    def encode(self, msg: msgspec.Struct) -> list[bytes]:
        """``[type byte, payload]`` for ``msg``."""
        return [bytes((TYPE_OF[type(msg)],)), self._enc.encode(msg)]

    def decode(self, frames: list[bytes]) -> Any:
        """The struct carried by ``frames``; raises `WireError` saying what is wrong."""
        if len(frames) != 2:
            raise WireError(f"expected 2 frames (type, payload), got {len(frames)}")
        head, payload = frames
        if len(head) != 1:
            raise WireError(f"message type frame must be 1 byte, got {len(head)}")
        try:
            mtype = MsgType(head[0])
        except ValueError:
            raise WireError(f"unknown message type {head[0]}") from None
        try:
            return self._decoders[mtype].decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
            # msgspec raises RecursionError for values nested too deeply (a payload of
            # a few hundred kilobytes can nest that far); it is the frame's fault too
            rid = self._request_id(payload) if mtype == MsgType.REQUEST else None
            raise WireError(f"malformed {mtype.name.lower()} message: {e}", rid) from None

    def _request_id(self, payload: bytes) -> str | None:
        try:
            raw = self._raw.decode(payload)
        except (msgspec.DecodeError, RecursionError):
            return None
        if isinstance(raw, list) and raw and isinstance(raw[0], str) and len(raw[0]) <= 512:
            return raw[0]
        return None
