"""`python -m openrlhf_replay.rehearsal -- <training command>`: a whole run's control flow, on a CPU.

A GPU run that crashes at the end of its first episode, or a condition that silently replays
nothing, costs node-hours before anyone sees it. This walks every step of every episode of the
exact command a launch script would run (`REHEARSE=1 bash examples/scripts/<script>.sh` passes
it here), at its real shape: batch sizes, GPU count, micro-batches, data, checkpoint cadence.

What runs for real, in this process: the launcher's argument handling and every check a launch
makes (as `validate` does); the controller class the launcher would start (upstream's
`PPOTrainer`, or `ReplayPPOTrainer` with replay on) and its `fit()` loop; the prompt dataset file
through upstream's dataset, dataloader, batching (`SamplesGenerator.generate_samples`) and
episode boundaries; upstream's experience maker (micro-batches, the forward dispatch, group
advantages); the replay buffer's evict / draw / store, the conversions to and from `Experience`,
the arrangement for ranks, RLEP regrouping; `get_max_steps` and the LR scheduler it sizes (paced by
rollout steps with replay on, as the policy actor paces it);
checkpoints (the replay buffer saved, read back and compared, and one resume of the whole
controller from a checkpoint); upstream's chunking of every batch over the data-parallel ranks
(`RayActorGroup.async_run_method_batch`, and each rank's `execute_batch`). The ranks live in
this process, so Ray's object store is bypassed (`ray.put` / `ray.get` hand the object over as
it is): serializing tensors between processes is not what a rehearsal checks, and it would
triple its time.

Stand-ins, and only these: generation (token ids drawn per prompt, short by default: lengths
change no control flow, while upstream's per-token returns loop makes long ones slow here),
the log-prob forward (random log-probs), rewards (each prompt has a fixed P(correct), drawn
around a mean solve rate, `--solve-rate`, so groups with none, some and all correct occur) and
the rank's training (its rows counted into micro-batches as its dataloader would, drop_last, and
an optimizer step counted, and the real LR scheduler stepped, every `accumulation` micro-batches,
as DeepSpeed does; a partial window carries over into the next step, as DeepSpeed's would; with
`--train.dynamic_batch_enable`, one optimizer step per local training batch of its rows, as the
replay actor's `AllRowsReplayBuffer` takes them: its packing by tokens, which sets only the
micro-batch count, is not modelled, so `micro_batches_per_rank` counts received Experiences).

Other shapes of the same run (`--shape "<flags>"`, e.g. another GPU count and the micro-batch
sizes that go with it) are rehearsed alongside, as shadows: they see the same steps, the same
fresh rollouts and the same replay draws (none of which depends on the shape), and run the
shape-dependent code for real on stand-in micro-batches that only carry their row counts: the
split of the replay over ranks, the arrangement of the list, upstream's chunking of the forward
pass and of the training batch, and each rank's training counts.

Prints what it rehearses, a one-row table of its figures, then one JSON object (the last line;
`--report PATH` also writes it to a file): steps expected and completed, fresh and replayed
rollouts per step (their spread, the share of steps that replay, a histogram, and the list of
counts step by step beside the candidates each draw had), the handling of replayed rows' pi_old
(`off_policy`: stale, refresh or recompute, as the run resolves it), optimizer steps per rollout
step (mean and spread) and per rank, micro-batches per rank, the LR schedule and its warm-up in
optimizer and rollout steps, where the schedule stands after the run and the position and LR the
last optimizer step ran at, replay ages, the stand-ins' settings, the crash if any. Exit status
0 when the run completed without a crash, 1 otherwise.
"""
