"""What stands in for TokenSpeed's code and its compiled dependencies while its own loop is
driven: the kernel package and the scheduler extension (:mod:`.packages`), the kernels on the
driven path, declared (:mod:`.kernels`), the model forward cut at the executor's
``forward_step`` (:mod:`.forward`) and the front end around the event loop: scheduler plans,
request states, hooks (:mod:`.front_end`). None of it is TokenSpeed's code."""
