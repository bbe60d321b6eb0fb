"""ubep under vLLM's modular MoE kernel (vLLM 0.23.0): dispatch in ``prepare``, combine in ``finalize``.

- ``core``: :class:`UbepPrepareFinalizeCore` (torch and ubep only), the settings and shared Buffers;
- ``modular``: ``UbepPrepareAndFinalize``, the ``FusedMoEPrepareAndFinalizeModular`` subclass, and
  its factory (imports vLLM: import it only inside vLLM);
- ``plugin``: the ``vllm.general_plugins`` entry point that selects it when ``UBEP_VLLM`` is set;
- ``conformance``: the names and signatures used here, checked against vLLM's source with ``ast``.

docs/INTEGRATIONS.md says how to serve with it.
"""

from ubep.integrations.vllm.core import BufferSpec, Settings, UbepPrepareFinalizeCore
from ubep.integrations.vllm.plugin import register

__all__ = ["BufferSpec", "Settings", "UbepPrepareFinalizeCore", "register"]
