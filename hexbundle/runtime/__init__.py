"""The CPU interpreter that runs a context binary's graphs as Genie chains them."""
