"""Backend process: the engine loop and everything that decides what the accelerator does."""
