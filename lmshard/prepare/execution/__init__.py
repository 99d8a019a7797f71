"""How a run is executed, at every scale: the plan (`units`: the inputs cut; `taskplan`: tasks, dedup buckets),
the stages and their tasks (`stages`: tokenize, dedup, select, write, finish; `unitfiles`,
`buckets`, `layout` for what each stage writes and reads), and the engines that run them: the
local worker pool (`local_exec`), Slurm arrays (`slurm`), Ray (`ray_exec`), and `lmshard
run-task`/`status` for any scheduler. Every prepare runs this way, from a few kilobytes read in
this process (`plainplan`) to a cluster. `pool` is the ordered worker pool of retokenize and
score's runs in one process.
"""
