"""The single worker-extension class vLLM mixes into its Worker: PoC forward + enforced sampling."""

from poc.worker import PocWorkerExtension
from sampling.enforced import EnforcedSamplingExtension


class WorkerExtension(PocWorkerExtension, EnforcedSamplingExtension):
    pass
