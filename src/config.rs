//! Validated, typed configuration built from the command line; no clap types past this point.
