"""Parameter specifications shared by several methods."""

from ..types.declare import Param, require_greater

FACTOR = Param(minimum=1.0, help="context extension factor s (target length / L0)")
ORIGINAL_MAX = Param(default=None, kind="int", minimum=1, help="L0, the pretraining length (max_position_embeddings)")
BETA_FAST = Param(default=32.0, exclusive_minimum=0, help="pairs turning more often than this in L0 keep theta_i")
BETA_SLOW = Param(default=1.0, exclusive_minimum=0, help="pairs turning less often than this in L0 get theta_i/s")
TRUNCATE = Param(default=True, kind="bool", help="round the ramp ends to whole pair indices (as transformers' yarn)")


__all__ = ["BETA_FAST", "BETA_SLOW", "FACTOR", "ORIGINAL_MAX", "TRUNCATE", "require_greater"]
