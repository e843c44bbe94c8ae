"""Secrets in the shapes real ones have, and log lines that hold them, for the redaction tests.

The shapes are the providers' published formats, as public secret scanners check them:

* Hugging Face user access token: ``hf_`` and 34 letters (detect-secrets' ``HuggingFaceDetector``,
  ``hf_[A-Za-z]{34}``; gitleaks' ``huggingface-access-token``);
* AWS: an access key id is ``AKIA`` (long-term) or ``ASIA`` (temporary) and 16 upper-case letters or
  digits; the secret access key is 40 base64 characters. The pair below is the example pair of AWS's own
  documentation (``AKIAIOSFODNN7EXAMPLE`` / ``wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY``);
* GitHub: ``ghp_`` and 36 letters or digits (classic personal access token, GitHub's 2021 token
  formats), ``github_pat_`` and 22 + ``_`` + 59 (fine-grained);
* Slack bot token: ``xoxb-`` and dash-separated numbers and letters;
* Weights & Biases API key: 40 hexadecimal digits ("our api keys are always 40 characters long",
  wandb/server#75), given as ``WANDB_API_KEY`` or to ``wandb login``;
* a private key in PEM form (``-----BEGIN … PRIVATE KEY-----`` … ``-----END … PRIVATE KEY-----``).

None of these is a live credential: the random ones are drawn here from a fixed seed, and every one is
put together at run time, so that no token-shaped literal sits in the repository for a secret scanner
to stop.
"""

from __future__ import annotations

import random
import string

_rng = random.Random(20261204)


def _draw(alphabet: str, n: int) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


ALNUM = string.ascii_letters + string.digits
HF = "hf" + "_" + _draw(string.ascii_letters, 34)
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_TEMP_ID = "ASIA" + _draw(string.ascii_uppercase + string.digits, 16)
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG" + "/bPxRfiCYEXAMPLEKEY"
GH = "gh" + "p_" + _draw(ALNUM, 36)
GH_FINE = "github" + "_pat_" + _draw(ALNUM, 22) + "_" + _draw(ALNUM, 59)
SLACK = "xo" + "xb-" + _draw(string.digits, 12) + "-" + _draw(string.digits, 13) + "-" + _draw(ALNUM, 24)
WANDB = _draw("0123456789abcdef", 40)
BEARER = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + _draw(ALNUM, 40) + "." + _draw(ALNUM + "-_", 43)
URL_PW = "Tr41n-" + _draw(ALNUM, 10)
PASSWORD = "hunter2-" + _draw(ALNUM, 8)
DB_TOKEN = "tok-" + _draw(ALNUM, 20)
API_KEY = _draw(ALNUM, 32)
CLIENT_SECRET = _draw(ALNUM, 24)
PEM_BODY = [_draw(ALNUM + "+/", 64) for _ in range(4)] + [_draw(ALNUM + "+/", 20) + "=="]
PEM = "\n".join(["-----BEGIN " + "OPENSSH PRIVATE KEY-----", *PEM_BODY, "-----END OPENSSH PRIVATE KEY-----"])

LINES: dict[str, tuple[str, list[str]]] = {
    # kind → (a log line that carries it, the secret parts that must not survive)
    "hf_token": (f"Logging in to the Hub with token {HF}", [HF]),
    "hf_token_env": (f"export HF_TOKEN={HF}", [HF]),
    "bearer": (f"POST /v1/chat headers={{'Authorization': 'Bearer {BEARER}'}}", [BEARER]),
    "bearer_header": (f"Authorization: Bearer {BEARER}", [BEARER]),
    "aws_access_key_id": (f"boto3 client with aws_access_key_id={AWS_ID} region=us-east-1", [AWS_ID]),
    "aws_temp": (f"assumed role, credentials {AWS_TEMP_ID} expire in 3600s", [AWS_TEMP_ID]),
    "aws_secret_access_key": (f"[default]\naws_secret_access_key = {AWS_SECRET}", [AWS_SECRET]),
    "url_password": (f"checkpoint store postgresql://trainer:{URL_PW}@db.internal:5432/runs", [URL_PW]),
    "wandb_api_key": (f"WANDB_API_KEY={WANDB} wandb: Currently logged in", [WANDB]),
    "wandb_login": (f"+ wandb login {WANDB}", [WANDB]),
    "private_key": (f"loaded deploy key:\n{PEM}\n", PEM_BODY),
    "password": (f"connecting with user=trainer password={PASSWORD}", [PASSWORD]),
    "password_colon": (f"Password: {PASSWORD}", [PASSWORD]),
    "password_json": (f'config: {{"user": "trainer", "password": "{PASSWORD}"}}', [PASSWORD]),
    "token": (f"resuming with token={DB_TOKEN}", [DB_TOKEN]),
    "api_key": (f"openai client api_key: {API_KEY}", [API_KEY]),
    "secret": (f"{{'client_secret': '{CLIENT_SECRET}', 'scope': 'read'}}", [CLIENT_SECRET]),
    "github_token": (f"git push https://x-access-token:{GH}@github.com/org/repo.git", [GH]),
    "github_fine": (f"GITHUB_TOKEN={GH_FINE}", [GH_FINE]),
    "slack_token": (f"notifier: posting to #train with {SLACK}", [SLACK]),
    "cli": (f"launch: torchrun train.py --hub-token {DB_TOKEN} --password {PASSWORD} --max-tokens 512",
            [DB_TOKEN, PASSWORD]),
}

KIND_OF = {"hf_token_env": "hf_token", "bearer_header": "bearer", "aws_temp": "aws_access_key_id",
           "wandb_login": "wandb_api_key", "password_colon": "password", "password_json": "password",
           "github_fine": "github_token", "github_token": "url_password", "cli": "token"}
"""The ``[REDACTED:kind]`` each line shows (its own name where not listed)."""

NORMAL = [
    "step 1200 | loss 2.3141 | lr 3.0e-04 | grad_norm 0.87 | tokens/s 48211 | tokens_per_s=48211.3",
    "{'loss': 1.2345, 'grad_norm': 0.5, 'learning_rate': 4.9e-05, 'epoch': 0.12}",
    "iteration      100/  500000 | consumed samples: 51200 | elapsed time per iteration (ms): 812.3",
    "NCCL INFO Channel 00/02 :    0   1   2   3   4   5   6   7",
    "NCCL INFO comm 0x55d8e1c0 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 1b000 commId 0x9c2e - Init COMPLETE",
    "Saving checkpoint to /scratch/runs/llama-7b/checkpoint-1200/pytorch_model.bin",
    "commit 4196919fb12cc4aa8ec0159a746c1e03b4ffa89c (HEAD -> main, origin/main)",
    "git rev-parse HEAD: 9f1c3e2a7b4d5e6f8091a2b3c4d5e6f708192a3b",
    "tokenizer: eos_token='</s>' pad_token=\"<pad>\" bos_token: <s> unk_token=<unk> model_max_length=2048",
    "TrainingArguments(hub_token=<HUB_TOKEN>, push_to_hub=False, use_auth_token=True, max_tokens=4096)",
    "def login(token: Optional[str] = None, password: str = None):",
    "model = AutoModel.from_pretrained(name, token=args.hf_token, trust_remote_code=True)",
    "wandb: Currently logged in as: alice (team-ml). Use `wandb login --relogin` to force relogin",
    "wandb: Appending key for api.wandb.ai to your netrc file: /root/.netrc",
    "MASTER_ADDR=10.1.2.3 MASTER_PORT=29500 WORLD_SIZE=16 http://10.1.2.3:29500 ssh://git@github.com:22/org/repo",
    "Enter your password: ********   (secret redacted by the launcher: password=***)",
    "the bearer token is refreshed every hour; token: 5 of 512",
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.35 GiB total capacity)",
    "KeyError: 'api_key_name' while reading secrets.yaml",
]
