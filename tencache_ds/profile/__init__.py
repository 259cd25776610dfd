"""Execution profiles: what a training step touched, in which order, how big and when (step_profile, recorder);
when a recorded step becomes the profile and when it stops predicting (lifecycle); keeping it on disk (store); next-use distances over a profiled step (next_use), which plan/ and cache/ evict by.
Pure, and below plan/ (which reads profiles): imports nothing of tencache_ds but the leaves."""
