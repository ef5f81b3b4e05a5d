"""Tools that run the partial collective on real local processes, over ``launching``, for
``tailtrain bench``: ``hang`` (a drill: one rank hangs, what the others wait) and
``microbench`` (eager-SGD's collective microbenchmark, which measures the network model the
simulator uses). Nothing in the runtime imports them."""
