//! Node-deployment mode (`--node-deployment`): which claims and volumes this instance owns, and
//! what it watches so that its memory follows its own node, not the cluster.
//!
//! - [`ownership`]: which claims this instance provisions (upstream `checkNode`), the
//!   immediate-binding competition, clearing a selected node that has no instance of our driver
//!   (in both modes), and which PVs this instance may delete.
//! - [`scope`]: what each instance lists and watches (label and field selectors, metadata
//!   stripping, the interesting-claims index, the labels of new PVs).
//! - [`watches`]: the shell that starts those scoped watches.
//! - [`labeller`]: labels our driver's PVs written by others (admins, tools, upstream) as they
//!   come, so that they enter their instance's scoped watch.
//!
//! The provisioning and reclaim controllers use this concern through [`ownership`]'s decisions
//! and [`scope::label_new_pv`]; it uses none of them.

pub(crate) mod labeller;
pub(crate) mod ownership;
pub(crate) mod scope;
pub(crate) mod watches;
