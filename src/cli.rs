//! Command line: every upstream flag with its name, type and default; Go-style `-flag=value` forms;
//! Go durations.
