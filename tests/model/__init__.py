"""A model of the whole handoff, searched by Hypothesis (docs/model.md).

``world`` is the small explicit world the parts talk to (an object store with resourceVersions,
conditional writes, bindings and late, ordered watches); ``locks``, ``extender`` and ``node`` are
the actors, replaying the step sequences of ``lockd.locks``, ``scheduler_ext.binder`` and
``deviceplugin.admission`` around the project's own pure decision functions; ``machine`` is the
Hypothesis state machine with the faults as actions and the invariants S1-S4 and L1.
"""
