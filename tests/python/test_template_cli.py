"""kwker template (the CLI) renders exactly what transformers renders, from a model folder
(tokenizer_config.json / chat_template.jinja), a .jinja file or a GGUF file's
tokenizer.chat_template."""
import json
import subprocess

from conftest import SHARED_DATA, cli_env, kwker_bin

DATA = SHARED_DATA
MESSAGES = [{"role": "system", "content": "Be nice."},
            {"role": "user", "content": "Hi \"there\" 🤗", "name": None},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"}]


def cli(model, request, tmp_path, *extra):
    path = tmp_path / "messages.json"
    path.write_text(json.dumps(request, ensure_ascii=False))
    p = subprocess.run([kwker_bin(), "template", "--model", str(model), *extra, str(path)],
                       capture_output=True, timeout=60, env=cli_env())
    return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode("utf-8", "replace")


def reference(source, messages, add_generation_prompt=True, **kw):
    import transformers.utils.chat_template_utils as ctu
    msgs = [{k: v for k, v in m.items() if v is not None} for m in messages]
    out, _ = ctu.render_jinja_template(conversations=[msgs], chat_template=source,
                                       add_generation_prompt=add_generation_prompt, **kw)
    return out[0]


def test_cli_model_folder_smollm(tmp_path):
    folder = DATA / "tokenizers" / "smollm" / "SmolLM2-135M-Instruct"
    rc, out, err = cli(folder, MESSAGES, tmp_path)
    assert rc == 0, err
    src = (folder / "chat_template.jinja").read_text()
    assert out == reference(src, MESSAGES, bos_token="<|im_start|>", eos_token="<|im_end|>")


def test_cli_tokenizer_config_llama3_with_options(tmp_path):
    folder = DATA / "tokenizers" / "llama3"
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    req = {"messages": MESSAGES, "add_generation_prompt": False}
    rc, out, err = cli(folder, req, tmp_path)
    assert rc == 0, err
    assert out == reference(cfg["chat_template"], MESSAGES, add_generation_prompt=False,
                            bos_token=cfg["bos_token"], eos_token=cfg["eos_token"])
    rc, out2, err = cli(folder, MESSAGES, tmp_path, "--no-generation-prompt")
    assert rc == 0 and out2 == out


def test_cli_jinja_file_and_gguf(tmp_path):
    jinja = DATA / "chat-templates" / "llamacpp" / "Qwen-Qwen2.5-7B-Instruct.jinja"
    rc, out, err = cli(jinja, {"messages": MESSAGES, "tools": None}, tmp_path)
    assert rc == 0, err
    assert out == reference(jinja.read_text(), MESSAGES)
    gguf_path = DATA / "llamacpp-vocab" / "ggml-vocab-phi-3.gguf"
    import gguf
    f = gguf.GGUFReader(str(gguf_path)).fields["tokenizer.chat_template"]
    src = bytes(f.parts[f.data[0]]).decode()
    rc, out, err = cli(gguf_path, MESSAGES, tmp_path)
    assert rc == 0, err
    assert out == reference(src, MESSAGES, bos_token="<s>", eos_token="<|endoftext|>")


def test_cli_errors(tmp_path):
    rc, out, err = cli(tmp_path / "missing", MESSAGES, tmp_path)
    assert rc != 0 and "missing" in err
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if %}")
    rc, out, err = cli(bad, MESSAGES, tmp_path)
    assert rc != 0 and "syntax error" in err
    raising = tmp_path / "raise.jinja"
    raising.write_text("{{ raise_exception('no system role') }}")
    rc, out, err = cli(raising, MESSAGES, tmp_path)
    assert rc != 0 and "no system role" in err
