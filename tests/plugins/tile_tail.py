"""Planted bug: a blocked kernel with 512-key blocks that counts its blocks as S // 512 once
S passes a block, dropping the last S % 512 keys (S = 513: key 512 is never read)."""

from tests.plugins.blocked import Blocked


class TileTail(Blocked):
    name = "bug.tile_tail"
    block = 512

    def blocks(self, S):
        return range(0, max(1, S // self.block) * self.block, self.block)
