"""What a target compiler makes of a program: the cost model per target, XLA compiles that
count kernels (deviceless GPU targets under `targets/`), and choices measured by compiling."""
