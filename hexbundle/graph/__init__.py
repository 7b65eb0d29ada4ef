"""Everything doit, and the only package that imports it:

  session    a run's config, its guard (lock, recovery) and DOIT_CONFIG
  actions    the one action wrapper: HexbundleError -> TaskFailed
  keys       up-to-date keys (options, toolchain, generator, pins), computed lazily
  checker    the XXH3 file checker (and doit's MD5 one, for `doit bench`)
  targets    target records: a target edited after its task built it reruns the task
  runguard   the order of lock, recovery and DB state, started by a command that writes
  lock       the build lock; recovery: after a killed run; dbstate: the variant DB seeded
  interrupts Ctrl-C and SIGTERM: one line, no traceback
  reporter   the console reporter and its banner (what is built, with what)
"""

# doit imports this package first (its command and loader plugins, pyproject.toml): from here
# on, a Ctrl-C while the run starts up is one line, not a traceback (graph.interrupts)
from hexbundle.graph import interrupts as _interrupts   # noqa: E402

if _interrupts.running_doit():
    _interrupts.guard_start_up()
    from hexbundle.support import testhooks as _testhooks
    _testhooks.set_step(_testhooks.PLUGINS)   # tests interrupt the start-up here too
    _testhooks.pause_point()
    _testhooks.set_step(None)
