"""Execution profiles: what a training step touched, in which order, how big and when (step_profile, recorder);
when a recorded step becomes the profile and when it stops predicting (lifecycle); keeping it on disk (store)."""
