"""geotrain's reducers (geotrain.comm) as DDP communication hooks."""

from geotrain.ddp.hook_target import HookTargetError, require_ddp_model
from geotrain.ddp.hooks import CodecHookState, codec_hook, register_codec_hook

__all__ = [
    "CodecHookState",
    "HookTargetError",
    "codec_hook",
    "register_codec_hook",
    "require_ddp_model",
]
