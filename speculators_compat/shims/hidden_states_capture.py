"""Worker side: capture layer outputs with hooks on the model's own forward, per request.

speculators 0.3.0's ``HiddenStatesWorkerExtension`` replaces ``model.model.forward`` with its
own Llama-style loop. On vLLM 0.11-0.16 that breaks in several ways, all fixed here at once by
letting the model run its own forward and hooking the requested decoder layers
(:mod:`speculators_compat.capture`):

- ``supports_eagle3`` gate: "Model DeepseekV3ForCausalLM does not support hidden state
  extraction" (DeepSeek-V2/V3 and Kimi never declare SupportsEagle3, 0.11-0.16);
- ``get_input_embeddings`` renamed ``embed_input_ids`` (0.12+): "AttributeError:
  'LlamaModel' object has no attribute 'get_input_embeddings'";
- DeepSeek decoder layers called as ``layer(positions, hidden_states, residual,
  llama_4_scaling)`` (0.12+): the keyword call misses ``llama_4_scaling``;
- multimodal wrappers (``KimiK25ForConditionalGeneration``): the text model is
  ``model.language_model.model``, not ``model.model``.

It also files each step's rows under their request (chunked prefill, reordering), for
``token_attribution``. Probe: vLLM's model interface (``VllmModel``) declares
``embed_input_ids`` (0.12+, every model's ``get_input_embeddings`` renamed at once), or
DeepSeek-V2's vLLM class fails speculators' ``supports_eagle3`` gate (0.11).
"""

from __future__ import annotations

from ..shim import Shim, replace_attr, undo_all
from ._targets import GENERATOR_REPLACED, WORKER, module

NAME = "hidden_states_capture"


def probe() -> bool:
    # vLLM's model interface (imported with vLLM's model registry, so free here) declares
    # embed_input_ids from 0.12, when every model's get_input_embeddings was renamed to it.
    from vllm.model_executor.models.interfaces_base import VllmModel

    if hasattr(VllmModel, "embed_input_ids"):
        return True
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM
    from vllm.model_executor.models.interfaces import supports_eagle3

    return not supports_eagle3(DeepseekV2ForCausalLM)


def _setup_hidden_states_capture(self, layer_ids):
    from vllm.distributed import get_tp_group

    from ..capture import CaptureState

    old = getattr(self, "_compat_capture", None)
    if old is not None:
        old.remove()
    runner = self.model_runner
    # All TP ranks compute the same states; rank 0 keeps them (as speculators 0.3.0 does).
    capture = CaptureState(runner.model, layer_ids, enabled=get_tp_group().rank_in_group == 0)
    self._compat_capture = capture
    self._layer_ids = frozenset(layer_ids)
    self._captured_states = None

    if not getattr(runner, "_compat_execute_wrapped", False):
        inner = runner.execute_model

        def execute_model(scheduler_output, *args, **kwargs):
            cap = self._compat_capture
            cap.begin_step()
            out = inner(scheduler_output, *args, **kwargs)
            if scheduler_output.total_num_scheduled_tokens:
                batch = runner.input_batch
                req_ids = [r for r in list(batch.req_ids)[: batch.num_reqs] if r is not None]
                cap.end_step(req_ids, scheduler_output.num_scheduled_tokens)
            return out

        runner.execute_model = execute_model
        runner._compat_execute_wrapped = True


def _reset_capture(self):
    if getattr(self, "_compat_capture", None) is None:
        raise RuntimeError("Must call _setup_hidden_states_capture before capturing states")
    self._compat_capture.requests.clear()


def _get_captured_states(self):
    return self._compat_capture.take_all_flat() if self._compat_capture.enabled else None


def _compat_take_states(self, req_ids):
    """The requests' states packed for the driver (``capture.unpack_states``) on rank 0, else None."""
    capture = self._compat_capture
    capture.release_memory_now_and_then()  # earlier batches' buffers are freed by now
    return capture.take_packed(list(req_ids)) if capture.enabled else None


_METHODS = {
    "_setup_hidden_states_capture": _setup_hidden_states_capture,
    "_reset_capture": _reset_capture,
    "_get_captured_states": _get_captured_states,
    "_compat_take_states": _compat_take_states,
}


def patch():
    ext = module(WORKER).HiddenStatesWorkerExtension
    return undo_all([replace_attr(ext, name, func, NAME) for name, func in _METHODS.items()])


SHIM = Shim(
    name=NAME,
    target=f"{WORKER}:HiddenStatesWorkerExtension._setup_hidden_states_capture "
    "(+ _reset_capture, _get_captured_states)",
    vllm=">=0.11",
    symptom="Worker failed with error 'Model DeepseekV3ForCausalLM does not support hidden state "
    "extraction' (vLLM up to 0.17); from 0.32: AttributeError: 'DeepseekV2Model' object has no "
    "attribute 'get_input_embeddings'",
    upstream="none found (speculators 0.4.0 reworked custom_worker for vLLM up to 0.16)",
    remove_when=GENERATOR_REPLACED,
    hook_module=WORKER,
    probe=probe,
    patch=patch,
)
