"""Methods added to vLLM's workers (`worker_extension_cls`); imported inside the engine's processes."""

from __future__ import annotations


class WeightSyncExtension:
    """Weight reload that keeps tied word embeddings tied.

    vLLM's in-place reload re-creates the input embedding's tensor layer by layer, but a
    tied `lm_head` keeps pointing at the old one (and, on CPU, at a GEMM pre-packed from
    it): the model then reads new embeddings and scores with old ones. Re-tying and
    re-packing after the reload restores the model the checkpoint describes.
    """

    def reload_and_retie(self, weights_path: str) -> bool:
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        model = self.model_runner.get_model()
        config = self.model_runner.model_config.hf_config.get_text_config()
        if not getattr(config, "tie_word_embeddings", False):
            return False
        model.lm_head.weight = model.model.embed_tokens.weight
        model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
        return True
