"""Parameter specifications shared by several methods."""

from ..declare import Param

FACTOR = Param(minimum=1.0, help="context extension factor s (target length / L0)")
ORIGINAL_MAX = Param(default=None, kind="int", minimum=1, help="L0, the pretraining length (max_position_embeddings)")
BETA_FAST = Param(default=32.0, exclusive_minimum=0, help="pairs turning more often than this in L0 keep theta_i")
BETA_SLOW = Param(default=1.0, exclusive_minimum=0, help="pairs turning less often than this in L0 get theta_i/s")
TRUNCATE = Param(default=True, kind="bool", help="round the ramp ends to whole pair indices (as transformers' yarn)")


def require_greater(params: dict, high_key: str, low_key: str, high_default: float, low_default: float) -> None:
    """Raise unless ``params[high_key]`` > ``params[low_key]`` (defaults filled in)."""
    high = params.get(high_key)
    low = params.get(low_key)
    high = high_default if high is None else high
    low = low_default if low is None else low
    if not high > low:
        raise ValueError(
            f"rope_parameters[{high_key!r}]={high!r} must be greater than rope_parameters[{low_key!r}]={low!r}"
        )
