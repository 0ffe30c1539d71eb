"""``WriterConfig``: the shard writer's settings (segment size, reserve, reclaiming)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WriterConfig:
    """Writer settings; sizes in bytes."""

    segment_bytes: int = 64 * 1024 * 1024
    # Room kept free for a seal frame and the flusher's checkpoint: 1 MiB covers both many times.
    reserve_bytes: int = 1024 * 1024
    # Seal early once this much is written and the flusher has caught up: with the flusher
    # keeping up, a shard holds about this much applied data, not up to segment_bytes.
    reclaim_bytes: int = 1024 * 1024
    # How often (at most) the writer reads the flusher's checkpoint to decide that.
    reclaim_check_s: float = 0.2

    def __post_init__(self) -> None:
        if self.segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        if self.reserve_bytes < 0:
            raise ValueError("reserve_bytes must be >= 0")
        if self.reclaim_bytes < 0:
            raise ValueError("reclaim_bytes must be >= 0")
        if self.reclaim_check_s < 0:
            raise ValueError("reclaim_check_s must be >= 0")
