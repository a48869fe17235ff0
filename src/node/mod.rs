//! Node ownership in node-deployment mode, and volumes whose node no longer exists.
