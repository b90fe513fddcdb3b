"""install(model): a transformers causal LM whose model.generate runs on Kwker.

    model = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")
    kwker.install(model)                 # precision="preserve": transformers' float32 numbers
    out = model.generate(**tok(["Hi", "Hello there"], return_tensors="pt", padding=True),
                         max_new_tokens=32)
    kwker.uninstall(model)               # transformers' own generate again

The weights Kwker runs are the model's own: when model.name_or_path is a folder or a Hugging Face
id in the local cache whose safetensors hold exactly the model's parameters, Kwker maps those
files; otherwise (a model changed in memory, made from a config, loaded in another dtype) the
model is saved once with save_pretrained to a temporary folder that uninstall removes.

generate() keeps transformers' contract: its GenerationConfig and keyword arguments (merged as
transformers merges them), max_new_tokens or max_length, min_new_tokens or min_length,
eos_token_id and pad_token_id, left-padded batches with their attention_mask (each row decoded
alone, as if it had no padding, by the serving engine's continuous batching), num_return_sequences
with sampling, streamers (prompt first, then each token), return_dict_in_generate (sequences
only), prompt_lookup_num_tokens, and an assistant_model that is itself installed (speculative
decoding; exact). The output is a LongTensor laid out as transformers lays it out: each row its
input as given, then its new tokens, then pad_token_id up to the longest row. Sampling draws its
seed from torch's default generator, so torch.manual_seed makes a call reproducible (the samples
differ from torch's own: the random streams are not the same). Anything else (beam search,
custom logits processors or stopping criteria, scores in the output, stop_strings, ...) runs
transformers' own generate with a warning naming it, or raises NotImplementedError with
fallback=False.

torch and transformers are imported when install() is called, never by `import kwker`.
"""
import copy
import os
import shutil
import tempfile
import threading
import warnings
import weakref

from .decode import KwkDecoder, runner_unsupported

_ATTR = "_kwker_install"

# GenerationConfig fields generate() honours, and the values at which the others change nothing
# (transformers' defaults); a field away from its neutral value sends the call to the fallback.
_NEUTRAL = {
    "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "typical_p": 1.0,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "diversity_penalty": 0.0,
    "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "force_words_ids": None,
    "constraints": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "sequence_bias": None, "guidance_scale": None,
    "watermarking_config": None, "dola_layers": None, "output_scores": False,
    "output_logits": False, "output_attentions": False, "output_hidden_states": False,
    "stop_strings": None, "top_h": None, "token_healing": False, "max_time": None,
}
# model keyword arguments generate() may be given; others (inputs_embeds, past_key_values, ...)
# go to the fallback
_MODEL_KWARGS = {"attention_mask", "use_cache", "tokenizer", "input_ids"}


class _Installed:
    """What install() left on a model: the decoder, the original generate, the saved copy."""

    def __init__(self, model, dec, saved_dir, fallback, original):
        self.dec = dec
        self.saved_dir = saved_dir
        self.fallback = fallback
        self.original = original  # the instance's own generate attribute, or None
        self.lock = threading.Lock()  # one call at a time: a decoder is not thread-safe
        self.mu = threading.Lock()  # guards the three below
        self.active = 0  # calls using the decoder (this model's, or it as an assistant)
        self.closing = False  # uninstalled: the last active call frees the decoder
        # the copy is removed with the model too, should uninstall never be called
        self.finalizer = weakref.finalize(model, _cleanup, dec, saved_dir)

    def pin(self):
        """Keep the decoder for a call; False once uninstalled."""
        with self.mu:
            if self.closing:
                return False
            self.active += 1
            return True

    def unpin(self):
        with self.mu:
            self.active -= 1
            last = self.closing and self.active == 0
        if last:
            self.finalizer()

    def close(self):
        """Free the decoder now, or when the calls using it end (an uninstall from a
        streamer's callback, or from another thread, must not free it under them)."""
        with self.mu:
            self.closing = True
            now = self.active == 0
        if now:
            self.finalizer()


def _cleanup(dec, saved_dir):
    dec.close()
    if saved_dir:
        shutil.rmtree(saved_dir, ignore_errors=True)


def install(model, precision="preserve", max_cache_len=None, n_threads=None, fallback=True,
            save_dir=None, max_batch=8, **decoder_kw):
    """Make model.generate run on Kwker; returns the KwkDecoder it uses (also model.kwker).

    model: a transformers causal LM on the CPU of an architecture Kwker runs (Llama, Mistral,
    Qwen2, Qwen3, Gemma 3's text decoder). precision, n_threads, max_batch and decoder_kw (
    cache_dir, mix_bits, act_bits, kv_bits, ...) are KwkDecoder's. max_cache_len: positions a
    sequence may use, prompt and reply (default: the model's max_position_embeddings, at most
    8192). fallback: True runs transformers' own generate for what Kwker does not do (with a
    warning), False raises NotImplementedError. save_dir: where a copy of the weights is saved
    when the model's files cannot be used (default: a temporary folder). Installing again
    replaces the earlier installation.
    """
    import torch

    if getattr(model, _ATTR, None) is not None:
        uninstall(model)
    if not hasattr(model, "generate") or not hasattr(model, "config"):
        raise TypeError("install() takes a transformers model (a PreTrainedModel with generate)")
    for p in model.parameters():
        if p.device.type != "cpu":
            raise ValueError("install(): the model's parameters are on %s; Kwker runs on the "
                             "CPU (model.to('cpu') first)" % p.device)
        break
    if max_cache_len is None:
        max_pos = getattr(model.config, "max_position_embeddings", None) or 4096
        max_cache_len = min(int(max_pos), 8192)
    path = _checkpoint_of(model, torch)
    saved_dir = None
    if path is None:
        saved_dir = tempfile.mkdtemp(prefix="kwker-install-", dir=save_dir)
        try:
            _save_copy(model, saved_dir, torch)
        except BaseException:
            shutil.rmtree(saved_dir, ignore_errors=True)
            raise
        path = saved_dir
    try:
        why = runner_unsupported(path, max_cache_len)
        if why:
            raise ValueError("install(): Kwker cannot run this model: %s" % why)
        dec = KwkDecoder(path, max_cache_len=max_cache_len, precision=precision,
                         n_threads=n_threads, max_batch=max_batch, **decoder_kw)
    except BaseException:
        if saved_dir:
            shutil.rmtree(saved_dir, ignore_errors=True)
        raise
    original = model.__dict__.get("generate")
    state = _Installed(model, dec, saved_dir, fallback, original)
    setattr(model, _ATTR, state)
    model.kwker = dec

    ref = weakref.ref(model)  # no cycle through the model's own attribute

    def generate(*args, **kwargs):
        return _generate(ref(), state, args, kwargs)

    generate.__doc__ = "transformers' generate, run by Kwker (kwker.install)."
    model.generate = generate
    return dec


def uninstall(model):
    """Give model its own generate back and free the decoder (and a saved copy). True when
    kwker was installed on it."""
    state = getattr(model, _ATTR, None)
    if state is None:
        return False
    if state.original is not None:
        model.generate = state.original
    else:
        model.__dict__.pop("generate", None)
    model.__dict__.pop("kwker", None)
    delattr(model, _ATTR)
    state.close()  # closes the decoder and removes the copy, now or after the calls in flight
    return True


def _save_copy(model, folder, torch):
    """The model's config and parameters as a checkpoint in folder: save_pretrained, or where
    it refuses (a model transformers dequantized from a GGUF file is "not serializable"), the
    config and the state dict written directly (a tied head left to tie_word_embeddings)."""
    try:
        model.save_pretrained(folder)
        return
    except (ValueError, NotImplementedError):
        pass
    from safetensors.torch import save_file
    shutil.rmtree(folder)  # what save_pretrained left before it refused
    os.mkdir(folder)
    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.save_pretrained(folder)
    tensors, seen = {}, set()
    for key, t in model.state_dict().items():
        if t.data_ptr() in seen:  # a tied copy (lm_head of tied embeddings)
            continue
        seen.add(t.data_ptr())
        tensors[key] = t.detach().contiguous()
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def _checkpoint_of(model, torch):
    """The folder whose safetensors hold exactly the model's parameters, or None."""
    name = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", "")
    if not name:
        return None
    folder = name if os.path.isdir(name) else _cached_snapshot(name)
    if folder is None:
        return None
    try:
        same = _same_config(model, folder) and _same_weights(model, folder, torch)
    except Exception:  # an unreadable or odd checkpoint: the saved copy is always right
        return None
    return folder if same else None


# config keys that say where or how a model was loaded, not what it computes
_CONFIG_WHERE = {"_name_or_path", "transformers_version", "dtype", "torch_dtype"}


def _same_config(model, folder):
    """Whether the folder's config.json is the model's config (one changed at load, as
    from_pretrained(path, rope_theta=...) does, must not be read from the file)."""
    ours = model.config.to_dict()
    theirs = type(model.config).from_pretrained(folder).to_dict()
    keys = (set(ours) | set(theirs)) - _CONFIG_WHERE
    return all(ours.get(k) == theirs.get(k) for k in keys if not k.startswith("_"))


def _cached_snapshot(name):
    """The local Hugging Face cache's snapshot folder of an id, or None (never downloads)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(name, "config.json")
    return os.path.dirname(found) if isinstance(found, str) else None


def _same_weights(model, folder, torch):
    """Whether the folder's safetensors hold every parameter of the model with its values
    (compared in float32, so a float32 model loaded from bf16 files is the same and a bf16
    model loaded from float32 files is not) and nothing else."""
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files or not os.path.isfile(os.path.join(folder, "config.json")):
        return False
    state = model.state_dict()
    seen = set()
    for f in files:
        with safe_open(os.path.join(folder, f), framework="pt") as st:
            for key in st.keys():
                p = state.get(key)
                if p is None:
                    return False
                t = st.get_tensor(key)
                if t.shape != p.shape or not torch.equal(t.float(), p.detach().float()):
                    return False
                seen.add(key)
    # what the files lack must be a tied copy (lm_head sharing the embeddings' storage)
    ptrs = {state[k].data_ptr() for k in seen}
    return all(k in seen or state[k].data_ptr() in ptrs for k in state)


def _unsupported(gc, model_kwargs, args):
    """The first option of a call Kwker does not run, as text, or None."""
    for key, neutral in _NEUTRAL.items():
        v = getattr(gc, key, None)  # None: unset (transformers 5 resolves defaults late)
        if v is not None and v != neutral and not (neutral is None and v in ((), [], {})):
            return "%s=%r" % (key, v)
    for key in args:
        if args[key]:
            return key
    for key, v in model_kwargs.items():
        if key not in _MODEL_KWARGS and v is not None and v is not False:
            return key
    if gc.num_return_sequences and gc.num_return_sequences > 1 and not gc.do_sample:
        return "num_return_sequences=%d without do_sample" % gc.num_return_sequences
    return None


def _generate(model, state, args, kwargs):
    import torch

    call_kwargs = kwargs  # the call as made, for the fallback
    kwargs = dict(kwargs)
    inputs = args[0] if args else kwargs.pop("inputs", None)
    gen_config = args[1] if len(args) > 1 else kwargs.pop("generation_config", None)
    extra = {k: kwargs.pop(k, None) for k in ("logits_processor", "stopping_criteria",
                                               "prefix_allowed_tokens_fn",
                                               "negative_prompt_ids",
                                               "negative_prompt_attention_mask",
                                               "synced_gpus")}
    if len(args) > 2:
        extra["positional arguments"] = True
    assistant = kwargs.pop("assistant_model", None)
    streamer = kwargs.pop("streamer", None)
    # transformers' test for "no max_length anywhere", made before the defaults fill it in
    default_max_length = (kwargs.get("max_length") is None and
                          (gen_config is None or gen_config.max_length is None) and
                          model.generation_config.max_length is None)
    gc, model_kwargs = _generation_config(model, gen_config, kwargs)
    input_ids = inputs if inputs is not None else model_kwargs.get("input_ids")
    why = _unsupported(gc, model_kwargs, extra)
    if why is None and input_ids is None:
        why = "no input_ids"
    if why is None and assistant is not None and getattr(assistant, _ATTR, None) is None:
        why = "an assistant_model not installed with kwker.install"
    if why is None and gc.prompt_lookup_num_tokens and assistant is not None:
        why = "both prompt_lookup_num_tokens and assistant_model"
    if why is not None:
        if not state.fallback:
            raise NotImplementedError("kwker.install: %s is not supported (install(model, "
                                      "fallback=True) runs transformers' generate for it)" % why)
        warnings.warn("kwker: %s is not supported: transformers' own generate runs this call"
                      % why, stacklevel=3)
        original = state.original or type(model).generate.__get__(model)
        return original(*args, **call_kwargs)
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError("input_ids must have shape [batch, length] with length > 0")
    mask = model_kwargs.get("attention_mask")
    rows = _rows(ids, mask, torch)
    n_in = ids.shape[1]
    max_length = int(gc.max_length)
    if gc.max_new_tokens is not None:
        max_length = n_in + int(gc.max_new_tokens)
    elif default_max_length:  # transformers: 20 new tokens, within the positions
        max_length += n_in
        max_pos = getattr(model.config, "max_position_embeddings", None)
        if max_pos is not None:
            max_length = min(max_length, int(max_pos))
    # max_length counts the prompt; transformers refuses one that leaves no room
    if gc.max_new_tokens is None and n_in >= max_length:
        raise ValueError("Input length of input_ids is %d, but `max_length` is set to %d. "
                         "Set max_new_tokens instead (as transformers says)."
                         % (n_in, max_length))
    max_new = max_length - n_in
    if gc.min_new_tokens is not None:
        min_new = int(gc.min_new_tokens)
    else:
        min_new = max(int(gc.min_length or 0) - n_in, 0)
    eos = gc.eos_token_id
    eos = [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]
    pad = gc.pad_token_id if gc.pad_token_id is not None else (eos[0] if eos else None)
    n_ret = int(gc.num_return_sequences or 1)
    if streamer is not None and (len(rows) > 1 or n_ret > 1):
        raise ValueError("a streamer takes one sequence: batch size and num_return_sequences "
                         "must be 1 (as transformers' streamers require)")
    longest = max(len(r) for r in rows) + max_new
    cache = _cache_len(state.dec)
    if cache and longest > cache:
        raise ValueError("kwker.install: a prompt of %d tokens and max_new_tokens %d need %d "
                         "positions; the decoder holds %d (install(model, max_cache_len=N))"
                         % (max(len(r) for r in rows), max_new, longest, cache))
    sample = dict(do_sample=bool(gc.do_sample), min_new_tokens=min_new, eos_token_id=eos)
    if gc.do_sample:
        sample.update(temperature=float(gc.temperature if gc.temperature is not None else 1.0),
                      top_k=int(gc.top_k or 0), top_p=float(gc.top_p if gc.top_p is not None
                                                            else 1.0),
                      min_p=float(gc.min_p or 0.0))
    if gc.repetition_penalty is not None:
        sample["repetition_penalty"] = float(gc.repetition_penalty)
    helper = getattr(assistant, _ATTR, None) if assistant is not None else None
    states = [state] + ([helper] if helper is not None and helper is not state else [])
    pinned = []
    try:
        for st in states:
            if not st.pin():
                raise RuntimeError("kwker.install: the model was uninstalled")
            pinned.append(st)
        # both decoders for the call, locked in one order whatever the call (no deadlock)
        locks = sorted((st.lock for st in states), key=id)
        for lk in locks:
            lk.acquire()
        try:
            news = _run(state, rows, n_ret, max_new, sample, gc, streamer, helper, ids, torch)
        finally:
            for lk in reversed(locks):
                lk.release()
    finally:
        for st in pinned:
            st.unpin()
    return _assemble(ids, news, n_ret, pad, gc, torch)


def _generation_config(model, gen_config, kwargs):
    """The call's GenerationConfig and model kwargs, merged as transformers' generate merges
    them (its own _prepare_generation_config where it has one: the call's arguments over
    generation_config over model.generation_config over the global defaults)."""
    prepare = getattr(model, "_prepare_generation_config", None)
    if prepare is not None:
        out = prepare(gen_config, **kwargs)
        return out[0], out[1]
    gc = copy.deepcopy(gen_config if gen_config is not None else model.generation_config)
    return gc, gc.update(**kwargs)


def _cache_len(dec):
    return int(getattr(dec, "max_cache_len", 0) or 0)


def _rows(ids, mask, torch):
    """Each row's tokens without its padding (the attention mask's ones)."""
    rows = []
    if mask is None:
        return [ids[i].tolist() for i in range(ids.shape[0])]
    mask = torch.as_tensor(mask)
    if mask.shape != ids.shape:
        raise ValueError("attention_mask has shape %s; input_ids %s" % (tuple(mask.shape),
                                                                         tuple(ids.shape)))
    if ids.shape[0] > 1 and bool((mask[:, -1] == 0).any()):
        # transformers' own warning; Kwker decodes each row without its padding either way
        warnings.warn("A decoder-only architecture is being used, but right-padding was "
                      "detected! For correct generation results, please set "
                      "`padding_side='left'` when initializing the tokenizer.", stacklevel=4)
    for i in range(ids.shape[0]):
        keep = mask[i].bool()
        row = ids[i][keep].tolist()
        if not row:
            raise ValueError("row %d of attention_mask is all zeros" % i)
        rows.append(row)
    return rows


def _seed(torch):
    """A seed from torch's default generator: torch.manual_seed makes the call reproducible."""
    return int(torch.randint(0, 2 ** 62, (1,)).item())


def _run(state, rows, n_ret, max_new, sample, gc, streamer, helper, ids, torch):
    """The new tokens of each output row (row i's n_ret samples one after another); helper:
    the installed assistant's state, or None."""
    dec = state.dec
    if len(rows) == 1 and n_ret == 1:
        kw = dict(sample)
        if gc.do_sample:
            kw["seed"] = _seed(torch)
        if helper is not None:
            kw.update(draft=helper.dec,
                      n_draft=int(getattr(gc, "num_assistant_tokens", 4) or 4))
        if gc.prompt_lookup_num_tokens:
            kw["lookup"] = int(gc.prompt_lookup_num_tokens)
        if streamer is not None:
            kw["streamer"] = _TorchStreamer(streamer, ids, torch)
        out = dec.generate(rows[0], max_new_tokens=max_new, prompt_cache=True, **kw)
        return [out[len(rows[0]):]]
    eng = dec.engine()
    reqs = []
    for row in rows:
        for _ in range(n_ret):
            kw = dict(sample)
            if gc.do_sample:
                kw["seed"] = _seed(torch)
            reqs.append(eng.submit(row, max_new_tokens=max_new, **kw))
    return [list(r.result()) for r in reqs]


class _TorchStreamer:
    """transformers' streamers get the input_ids as given (a [1, n] LongTensor, padding
    included), then each new token as a [1] one; KwkDecoder hands numpy arrays."""

    def __init__(self, streamer, prompt, torch):
        self.s, self.prompt, self.torch = streamer, prompt, torch

    def put(self, ids):
        if self.prompt is not None:
            t, self.prompt = self.prompt, None
        else:
            t = self.torch.as_tensor(ids, dtype=self.torch.long)
        self.s.put(t)

    def end(self):
        self.s.end()


def _assemble(ids, news, n_ret, pad, gc, torch):
    """transformers' layout: each input row (as given, padding included) repeated n_ret times,
    its new tokens, then pad_token_id up to the longest reply."""
    width = max(len(n) for n in news)
    if pad is None and any(len(n) < width for n in news):
        pad = 0  # unreachable in practice: rows end early only at an eos, which pad defaults to
    out = torch.full((len(news), ids.shape[1] + width), int(pad or 0), dtype=torch.long)
    for r, new in enumerate(news):
        out[r, :ids.shape[1]] = ids[r // n_ret]
        if new:
            out[r, ids.shape[1]:ids.shape[1] + len(new)] = torch.as_tensor(list(new))
    out = out.to(ids.device)
    if gc.return_dict_in_generate:
        from transformers.generation.utils import GenerateDecoderOnlyOutput
        return GenerateDecoderOnlyOutput(sequences=out)
    return out
