"""The life of one store's profile: which step becomes the profile, when it stops predicting the live step, and
when a new one replaces it. Owns: the phases below and their transitions, loading and saving the profile
(profile/store.py), and the Belady index the store evicts by. Pure: no torch, no DeepSpeed. The swappers drive it
(integrations/deepspeed/*_swapper.py: ``load`` once the tensors are known, ``end_step`` at each step boundary); the
store's StepRecorder compares each access with the profile (one comparison per access).

Phases::

    WARMUP --first training step--> RECORDING --step complete--> PREDICTING <--step ends-- DIVERGED
      |                                                          ^    |                       ^
      +---------------- a profile was loaded --------------------+    +--- an access differs --+

- WARMUP: initialisation steps (stage 3 reads every tensor once to build its state): not recorded as the
  profile, not checked. A loaded profile already serves eviction.
- RECORDING: no profile yet: the step runs on demand fetching (no index: LRU eviction) and becomes the profile,
  saved, once complete.
- PREDICTING: the profile has named every access of this step so far: Belady eviction and prefetch may use it.
- DIVERGED: an access differed from the profile, or came after its end, or the step ended before it (an eval
  pass, generation, a changed setting): consumers fall back to demand fetching until the step ends.

A step that repeats a profile without NVMe reads, reading NVMe itself (a smaller budget than the recording run's,
a tier given back under memory pressure), replaces it: reads ahead are planned from reads' times.

A step that does not repeat the profile is kept as the candidate. If the next step repeats the candidate, the
change lasts (a new setting, or DeepSpeed's steady state after its own first traced step) and the candidate
replaces the profile, saved; a one-off (an eval pass) leaves the profile as it was. Either way the next step is
predicted by the profile. Nothing here can change a result: eviction and prefetch choose *when* bytes move, never
which bytes a tensor has.

Timing. The first STEADY_STEPS steps that repeat the profile, after the run's first training step, are timed and
their summary saved with it (profile/steady.py): a run's first training step carries first-step costs the later
ones do not, whether it was recorded or repeated a loaded profile. A summary on file is replaced only by one of as
many steps (a restart that stops early leaves the longer one).
"""
import enum
from typing import Callable, Hashable, List, Optional, Sequence, Tuple

from ..log import logger
from .next_use import NextUseIndex
from . import store as profile_store
from .recorder import StepRecorder
from .steady import STEADY_STEPS, SteadyTimings
from .step_profile import StepProfile


class Phase(enum.Enum):
    WARMUP = "warmup"          # initialisation: nothing recorded or checked
    RECORDING = "recording"    # no profile: this step becomes it
    PREDICTING = "predicting"  # the profile matched every access of this step so far
    DIVERGED = "diverged"      # this step left the profile: demand fetching until it ends


LEGAL_TRANSITIONS = {
    Phase.WARMUP: {Phase.WARMUP, Phase.RECORDING, Phase.PREDICTING},
    Phase.RECORDING: {Phase.RECORDING, Phase.PREDICTING},  # PREDICTING: complete, or a profile loaded meanwhile
    Phase.PREDICTING: {Phase.PREDICTING, Phase.DIVERGED},
    Phase.DIVERGED: {Phase.PREDICTING},
}


def _same(key):
    return key


class ProfileLifecycle:
    """The profile of one store (one section of the profile file).

    Args:
        recorder: the store's recorder (``store.recorder``); this object tells it what to expect.
        path: the profile file (None: memory only).
        section: its section, e.g. "params".
        first_training_step: how many step ends belong to initialisation (WARMUP).
        to_file, from_file: store key <-> key written to the file (e.g. a path <-> its base name).

    Consumers read ``phase``, ``index`` (NextUseIndex, or None when the profile does not predict this step),
    ``profile``, ``generation`` (bumped whenever the profile is replaced: re-plan prefetch then) and ``steady``
    (the timings of the steps that repeated this profile, or None before one did).
    """

    def __init__(self, recorder: StepRecorder, path: Optional[str], section: str, first_training_step: int = 1,
                 to_file: Callable[[Hashable], Hashable] = _same, from_file: Callable[[Hashable], Hashable] = _same):
        self.recorder = recorder
        self._path, self._section = path, section
        self._first_training_step = first_training_step
        self._to_file, self._from_file = to_file, from_file
        self._phase = Phase.WARMUP if first_training_step > 0 else Phase.RECORDING
        self._profile: Optional[StepProfile] = None
        self._index: Optional[NextUseIndex] = None
        self._candidate: Optional[StepProfile] = None
        self._repeats: List[StepProfile] = []  # the timed steps that repeated the profile, at most STEADY_STEPS
        self.steady: Optional[SteadyTimings] = None
        self._fingerprint: Optional[str] = None
        self._facts: dict = {}
        self._steps_ended = 0
        self.source = "none"  # "loaded", "recorded" or "none"
        self.generation = 0   # COUNT: profiles adopted (loaded or recorded)
        self.divergences = 0  # COUNT: steps that left the profile
        self.diverged_at: Optional[int] = None  # access index of the latest divergence

    # ------------------------------------------------------------------------------------------- reading
    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def profile(self) -> Optional[StepProfile]:
        return self._profile

    @property
    def index(self) -> Optional[NextUseIndex]:
        """Next-use distances of the profile while it predicts the live step (a loaded one also in WARMUP)."""
        if self._phase in (Phase.WARMUP, Phase.PREDICTING):
            return self._index
        return None

    # ----------------------------------------------------------------------------------------- transitions
    def load(self, tensors: Sequence[Tuple[Hashable, int]], **facts) -> Optional[NextUseIndex]:
        """Fingerprint what the profile describes and adopt a saved one recorded for the same, if any.

        Args:
            tensors: (key, numel) of every tensor of the store, sorted: the partitioning.
            facts: JSON-able facts that change the access sequence (dtype, world size, config settings).
        """
        tensors = [list(pair) for pair in tensors]
        self._fingerprint = profile_store.fingerprint(tensors, facts)
        self._facts = dict(facts, tensors=len(tensors), elements=sum(numel for _key, numel in tensors))
        saved = profile_store.load_section(self._path, self._section, self._fingerprint, self._facts)
        if saved is not None:
            self._adopt(saved.with_keys(self._from_file), source="loaded", save=False)
            if self._phase is Phase.RECORDING:  # found after initialisation: it predicts from here on
                self._move(Phase.PREDICTING)
            self._expect_profile()
        return self.index

    def end_step(self) -> Optional[NextUseIndex]:
        """The current step ended: decide what it was (see the module docstring). Returns ``index`` for the next."""
        accesses = self.recorder.position
        finished = self.recorder.end_step()
        self._steps_ended += 1
        if self._phase is Phase.WARMUP:
            if self._steps_ended >= self._first_training_step:
                self._move(Phase.PREDICTING if self._profile is not None else Phase.RECORDING)
        elif accesses == 0:
            pass  # nothing happened (no access since the last boundary): nothing learned
        elif self._phase is Phase.RECORDING:
            if finished is not None:
                self._adopt(finished, source="recorded")
                self._move(Phase.PREDICTING)
        elif self._phase is Phase.PREDICTING and accesses == len(self._profile):
            # The step repeated the profile: a step that left it before was a one-off, not the first of a change
            # (an eval pass every N steps is the same one-off each time, and must not replace the profile).
            self._candidate = None
            self._timed_repeat(finished)
        else:
            if self._phase is Phase.PREDICTING:
                self._diverged(accesses)  # the step ended before the profile did
            self._end_diverged_step(finished)
        self._expect_profile()
        return self.index

    def _timed_repeat(self, finished: Optional[StepProfile]) -> None:
        if self._reads_first_measured(finished):
            return
        if self._steps_ended <= self._first_training_step + 1:
            return  # the run's first training step (a loaded profile predicts it): first-step costs
        if finished is None or len(self._repeats) >= STEADY_STEPS:
            return
        self._repeats.append(finished)
        self.steady = SteadyTimings.of(self._repeats)
        if self._fingerprint is None:
            return
        try:
            profile_store.save_steady(self._path, self._section, self._fingerprint, self.steady)
        except (OSError, TypeError, ValueError) as err:  # a profile is an optimisation: never stop training
            logger.warning("profile %s [%s]: its steady timings could not be saved (%s)", self._path, self._section,
                           err)

    def _reads_first_measured(self, finished: Optional[StepProfile]) -> bool:
        """A step that repeated a profile without a read (everything was held when it was recorded) and read NVMe
        itself (a smaller budget in this run, a tier given back under memory pressure) becomes the profile: its reads'
        times are what reads ahead are planned from (none is planned from a profile without them), and the
        sequence is the same. Until 2026-12-07 such a profile stayed, and no read was ever scheduled ahead
        (helper-169). Returns whether it did."""
        if finished is None or self._profile.measured_read_bytes_per_s is not None \
                or finished.measured_read_bytes_per_s is None:
            return False
        logger.info("profile [%s]: the step read NVMe where the profile read nothing; its timings replace the "
                    "profile's, and reads ahead are planned from them", self._section)
        self._adopt(finished, source=self.source)
        return True

    def _end_diverged_step(self, finished: Optional[StepProfile]) -> None:
        if finished is not None and finished.same_sequence(self._candidate):
            logger.info("profile [%s]: the access sequence changed (%d accesses per step, was %d) and the new one "
                        "repeated: it replaces the profile", self._section, len(finished), len(self._profile))
            self._adopt(finished, source="recorded")
            self._candidate = None
        else:
            self._candidate = finished
        self._move(Phase.PREDICTING)

    def _diverged(self, position: int) -> None:
        """Called by the recorder at the first access that differs from the profile (or at the step's end)."""
        self._move(Phase.DIVERGED)
        self.divergences += 1
        self.diverged_at = position
        logger.debug("profile [%s]: the step left the profile at access %d of %d; demand fetching until it ends",
                     self._section, position, len(self._profile))

    def _expect_profile(self) -> None:
        if self._phase is Phase.PREDICTING:
            self.recorder.expect(self._profile.keys, self._diverged)
        else:
            self.recorder.expect(None)

    def _move(self, new: Phase) -> None:
        assert new in LEGAL_TRANSITIONS[self._phase], f"profile [{self._section}]: {self._phase} -> {new}"
        self._phase = new

    def _adopt(self, step: StepProfile, source: str, save: bool = True) -> None:
        self._profile, self._index = step, NextUseIndex(step.keys)
        self._repeats, self.steady = [], None  # timings of another sequence's repeats say nothing about this one
        self.source = source
        self.generation += 1
        if save and self._fingerprint is not None:
            try:
                profile_store.save_section(self._path, self._section, self._fingerprint,
                                           step.with_keys(self._to_file), self._facts)
            except (OSError, TypeError, ValueError) as err:  # a profile is an optimisation: never stop training
                logger.warning("profile %s [%s] could not be saved (%s); it is used in memory only", self._path,
                               self._section, err)
