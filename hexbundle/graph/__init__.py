"""Everything doit: the checker, up-to-date keys, target records, run guard, reporter."""
