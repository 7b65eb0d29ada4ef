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
