//! Redfish power source (placeholder until implemented).
