"""Teacher-forced calibration of the correction memory (`calispec calibrate --corpus`).

corpus (documents and prompts from files) · teacher (one batched forward per model: the greedy
predictions at every position, and which positions a greedy SD run would turn into rejection
events) · generate (the target's own greedy continuations, batched) · sink (RecordEvents with
the writer token) · job (the whole run, with its summary) · ray_job (the same over Ray workers).
"""
