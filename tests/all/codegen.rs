//! The guest's code as compiled under the patched register allocator (host/vendor/README.md):
//! regalloc2's checker verifies every function's allocation, in each of the three ways the
//! sandbox compiles the guest (fuel; epochs without fuel; neither).

use corral_sandbox::{Sandbox, SandboxConfig};

fn check(fuel: bool, epochs: bool) {
    let config = SandboxConfig {
        fuel,
        epochs,
        ..SandboxConfig::default()
    };
    Sandbox::check_register_allocation(&config).expect("checked allocation");
}

#[test]
fn every_guest_function_is_allocated_correctly_with_fuel() {
    check(true, true);
}

#[test]
fn every_guest_function_is_allocated_correctly_with_epochs() {
    check(false, true);
}

#[test]
fn every_guest_function_is_allocated_correctly_without_fuel_or_epochs() {
    check(false, false);
}
