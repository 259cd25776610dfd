"""Hugging Face's Trainer with a DeepSpeed config, as most users run ZeRO-3 offload: a GPT-2 shape (random weights,
synthetic tokens, fp32), 2 ranks through the ``deepspeed`` launcher, ZeRO-3 with parameters and optimizer offloaded,
the config's batch, optimizer (AdamW) and scheduler (WarmupDecayLR) values left "auto" for the Trainer to fill,
gradient accumulation 2, an evaluation every 2 steps, a checkpoint every 3, 6 steps; or the same run resumed from
its checkpoint after step 3. Rank 0 prints one RESULT line: every logged loss and evaluation loss with its step and
learning rate, the SHA-256 of the model the Trainer saves at the end (gathered whole), the step this process
trained first, and whether tencache's swappers ran.

    deepspeed --num_gpus 2 tests/deepspeed/hf_trainer_run.py stock|tencache[=HOST_CACHE_BYTES] cpu|nvme OUT [resume]

``tencache`` alone adds an empty block (every key at its default; the budgets' is "auto"): Hugging Face's Trainer (through
Accelerate) takes every "auto" in a DeepSpeed config for a value of its own to fill, and stops at one it does not
know ("`tencache.host_cache_bytes` not found in kwargs"), so with the Trainer the block's "auto" keys are left out.
"""
import hashlib
import json
import os
import sys

ARGS = [arg for arg in sys.argv[1:] if not arg.startswith("--local_rank")]  # the launcher adds --local_rank=N
MODE, DEVICE, OUT = ARGS[:3]
RESUME = ARGS[3:4] == ["resume"]
if MODE.startswith("tencache"):
    import tencache_ds  # installs the swappers (DeepSpeed is imported already where forked)
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

VOCAB, TOKENS = 2048, 32


def ds_config():
    offload = {"device": DEVICE, "pin_memory": False}
    if DEVICE == "nvme":
        offload.update(nvme_path=os.path.join(OUT, "nvme"), buffer_count=6)
    config = {
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                          "warmup_num_steps": "auto", "total_num_steps": "auto"}},
        # several optimizer sub-groups per rank, some below the aio block (kept in memory): their biases and layer
        # norms are persistent parameters, which a resume must gather again from the restored masters
        "zero_optimization": {"stage": 3, "sub_group_size": 2e5, "offload_optimizer": offload,
                              "offload_param": dict(offload, buffer_size=2e7) if DEVICE == "nvme" else offload,
                              "stage3_gather_16bit_weights_on_model_save": True},
        "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                "overlap_events": True}}
    # train_batch_size left out: the Trainer fills "auto" with per-device batch × accumulation × its world size,
    # which on the CPU accelerator it counts before the process group exists (1)
    if MODE.startswith("tencache"):
        budget = MODE.partition("=")[2]
        config["tencache"] = {"host_cache_bytes": budget} if budget else {}
    return config


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count, seed):
        self.ids = torch.randint(0, VOCAB, (count, TOKENS), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class FirstStep(TrainerCallback):
    """The step this process trained first: 0, or where a resume started."""

    step = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.step is None:
            self.step = state.global_step


def main():
    # use_cpu: on the CPU accelerator Accelerate sets up its gloo process group only so (without it, it counts one
    # process and its gathers fail); the DeepSpeed config still makes the Trainer run DeepSpeed's engine
    args = TrainingArguments(
        output_dir=os.path.join(OUT, "run"), per_device_train_batch_size=2, per_device_eval_batch_size=2,
        gradient_accumulation_steps=2, learning_rate=1e-3, weight_decay=0.01, warmup_steps=2, max_grad_norm=1.0,
        max_steps=6, logging_steps=1, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=3,
        deepspeed=ds_config(), report_to=[], seed=42, use_cpu=True, dataloader_num_workers=0)
    torch.manual_seed(42)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=VOCAB, n_positions=64,
                                       bos_token_id=0, eos_token_id=0))
    first_step = FirstStep()
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(64, 1), eval_dataset=Tokens(8, 2),
                      callbacks=[first_step])
    trainer.train(resume_from_checkpoint=os.path.join(OUT, "run", "checkpoint-3") if RESUME else None)
    history = [[entry["step"], entry.get("loss", entry.get("eval_loss")), entry.get("learning_rate")]
               for entry in trainer.state.log_history if "loss" in entry or "eval_loss" in entry]
    swapping = tencache_ds.stats(trainer.model_wrapped)["tencache_enabled"] if "tencache_ds" in sys.modules else 0
    trainer.save_model(os.path.join(OUT, "final"))
    if trainer.is_world_process_zero():
        from safetensors.torch import load_file
        weights = load_file(os.path.join(OUT, "final", "model.safetensors"))
        digest = hashlib.sha256()
        for name in sorted(weights):
            digest.update(name.encode())
            digest.update(weights[name].float().numpy().tobytes())
        print("RESULT " + json.dumps({"history": history, "weights": digest.hexdigest(),
                                      "tencache": "tencache_ds" in sys.modules, "swapping": swapping,
                                      "first_step": first_step.step}), flush=True)


if __name__ == "__main__":
    main()
