"""ubep as vllm-ascend's MoE communication (vllm-ascend 0.23.0.post1, vLLM 0.23.0).

- ``core``: :class:`UbepTokenDispatcherCore` (torch and ubep only): vllm-ascend's ``token_dispatch`` /
  ``token_combine`` over a padded (decode) and a compact (prefill) ``ubep.Buffer``; the settings.
- ``comm_method``: ``UbepTokenDispatcher``, ``UbepPrepareAndFinalize`` and ``UbepCommImpl``, thin
  subclasses of vllm-ascend's ABCs (imports vllm-ascend: only inside vllm-ascend's workers).
- ``plugin``: the ``vllm.general_plugins`` entry point :func:`register`, which adds the comm type and
  makes vllm-ascend's selection return it under ``additional_config={"moe_comm": "ubep"}``.
- ``conformance``: the names and signatures used here, checked against vllm-ascend's source with ``ast``.

docs/INTEGRATIONS.md says how to serve with it.
"""

from ubep.integrations.vllm_ascend.core import (
    ENV,
    LayerShape,
    Settings,
    UbepTokenDispatcherCore,
    requested,
)
from ubep.integrations.vllm_ascend.plugin import register

__all__ = ["ENV", "LayerShape", "Settings", "UbepTokenDispatcherCore", "register", "requested"]
