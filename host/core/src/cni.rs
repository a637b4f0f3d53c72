//! CNI specification types: versions, error objects, network configurations and results.
