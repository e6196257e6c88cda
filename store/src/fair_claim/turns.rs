//! The order in which a fair claim takes what its walks found, worked out in Rust: the
//! keys' turns, and the tenants' weighted fair queuing above them. Pure, so the orders
//! the design promises are unit-tested here on their own.

/// One key's due tasks as a walk found them, best first (rank, then id), its attempts
/// already in flight (claimed or running) and its limit.
#[derive(Debug, Clone)]
pub(super) struct KeyTasks {
    pub key: String,
    pub held: u32,
    pub limit: u32,
    pub ids: Vec<String>,
}

/// Up to `limit` of `keys`' tasks, as `(key index, task index)`, in turns: a key's n-th
/// task in flight or taken is its turn n, every key's turn n comes before any key's turn
/// n + 1, and within a turn the keys go in the order given (the rotation). No key gets a
/// turn past its limit, so none ever holds more.
pub(super) fn in_turns(keys: &[KeyTasks], limit: usize) -> Vec<(usize, usize)> {
    let mut turns: Vec<(u32, usize, usize)> = keys
        .iter()
        .enumerate()
        .flat_map(|(k, key)| {
            (0..key.ids.len())
                .map(move |t| (key.held + t as u32 + 1, k, t))
                .take_while(move |&(turn, _, _)| turn <= key.limit)
        })
        .collect();
    turns.sort_unstable();
    turns.truncate(limit);
    turns.into_iter().map(|(_, k, t)| (k, t)).collect()
}

/// A tenant's claim on the next slots: its weight, its attempts in flight, and how many
/// due tasks it can give (an upper bound until its keys have been walked).
#[derive(Debug, Clone, Copy)]
pub(super) struct Demand {
    pub weight: u32,
    pub held: u32,
    pub supply: u32,
}

/// Which tenant each of up to `slots` slots goes to, in order, by weighted fair queuing:
/// a tenant's n-th task in flight or taken finishes its share at `n / weight` (its
/// virtual time), the earliest goes next, and a tie goes to the tenant given first (the
/// callers pass them in rotation order). No tenant gets more than its `supply`, nor
/// more than `per_tenant` in flight.
///
/// So with `T` tenants waiting, each one's next task is among the next `T` slots
/// whatever the others hold or have due (at equal weights), and a tenant of weight `w`
/// takes `w` slots in each round where one of weight 1 takes one.
pub(super) fn weighted(tenants: &[Demand], per_tenant: u32, slots: usize) -> Vec<usize> {
    let mut taken = vec![0u32; tenants.len()];
    let mut order = Vec::with_capacity(slots);
    while order.len() < slots {
        // (virtual time as numerator and weight, tenant): compared by cross-multiplying,
        // so weights up to u32::MAX stay exact. Linear in the tenants per slot: a claim
        // considers at most a few hundred of them.
        let mut next: Option<(u64, u64, usize)> = None;
        for (i, demand) in tenants.iter().enumerate() {
            let turn = demand.held + taken[i] + 1;
            if taken[i] >= demand.supply || turn > per_tenant {
                continue;
            }
            let (numerator, weight) = (u64::from(turn), u64::from(demand.weight.max(1)));
            let earlier = next.is_none_or(|(best_numerator, best_weight, _)| {
                u128::from(numerator) * u128::from(best_weight)
                    < u128::from(best_numerator) * u128::from(weight)
            });
            if earlier {
                next = Some((numerator, weight, i));
            }
        }
        let Some((_, _, i)) = next else { break };
        taken[i] += 1;
        order.push(i);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, held: u32, due: usize) -> KeyTasks {
        KeyTasks {
            key: name.into(),
            held,
            limit: 5,
            ids: (0..due).map(|i| format!("{name}{i}")).collect(),
        }
    }

    fn named(keys: &[KeyTasks], picks: &[(usize, usize)]) -> Vec<String> {
        picks.iter().map(|&(k, t)| keys[k].ids[t].clone()).collect()
    }

    #[test]
    fn every_keys_first_before_any_keys_second_in_the_order_given() {
        let keys = [key("c", 0, 3), key("a", 0, 1), key("b", 0, 2)];
        assert_eq!(
            named(&keys, &in_turns(&keys, 10)),
            ["c0", "a0", "b0", "c1", "b1", "c2"]
        );
        assert_eq!(named(&keys, &in_turns(&keys, 2)), ["c0", "a0"]);
    }

    #[test]
    fn a_key_in_flight_waits_its_turn_and_never_passes_its_limit() {
        // "a" holds one: its first due task is its second turn, after b's first.
        let limited = |name, held, due, limit| KeyTasks {
            limit,
            ..key(name, held, due)
        };
        let keys = [limited("a", 1, 3, 2), limited("b", 0, 3, 2)];
        assert_eq!(
            named(&keys, &in_turns(&keys, 10)),
            ["b0", "a0", "b1"],
            "a stops at 2 in flight, b at 2 taken"
        );
        let full = [limited("a", 2, 3, 2)];
        assert!(in_turns(&full, 10).is_empty(), "a key at its limit");
        let cut = [limited("a", 0, 3, 1), limited("b", 0, 3, 3)];
        assert_eq!(
            named(&cut, &in_turns(&cut, 10)),
            ["a0", "b0", "b1", "b2"],
            "each key its own limit"
        );
    }

    fn demand(weight: u32, held: u32, supply: u32) -> Demand {
        Demand {
            weight,
            held,
            supply,
        }
    }

    #[test]
    fn equal_tenants_alternate_from_the_first_given() {
        let tenants = [demand(1, 0, 100), demand(1, 0, 100), demand(1, 0, 100)];
        assert_eq!(weighted(&tenants, 1000, 7), [0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn a_tenant_of_weight_three_takes_three_slots_a_round() {
        let tenants = [demand(1, 0, 100), demand(3, 0, 100)];
        let order = weighted(&tenants, 1000, 8);
        assert_eq!(order.iter().filter(|&&t| t == 1).count(), 6);
        // Virtual times: 1/3, 2/3, then 1 for both (the first given goes first), 4/3, 5/3,
        // then 2 for both.
        assert_eq!(order, [1, 1, 0, 1, 1, 1, 0, 1]);
    }

    #[test]
    fn a_tenant_with_attempts_in_flight_comes_after_those_without() {
        // The flood holds 40 in flight; 50 small tenants each get a slot before its next.
        let mut tenants = vec![demand(1, 40, 100_000)];
        tenants.extend((0..50).map(|_| demand(1, 0, 2)));
        let order = weighted(&tenants, 64, 64);
        assert_eq!(order.len(), 64);
        assert!(order[..50].iter().all(|&t| t != 0), "{order:?}");
        assert!(
            order[..50]
                .iter()
                .enumerate()
                .all(|(slot, &t)| t == slot + 1)
        );
    }

    #[test]
    fn supply_and_the_per_tenant_cap_bound_each_share() {
        let tenants = [demand(1, 0, 1), demand(1, 3, 100), demand(5, 0, 100)];
        let order = weighted(&tenants, 4, 100);
        let count = |t| order.iter().filter(|&&o| o == t).count();
        assert_eq!(count(0), 1, "one due task");
        assert_eq!(count(1), 1, "three in flight, cap four");
        assert_eq!(count(2), 4, "cap four");
        assert_eq!(order.len(), 6, "then nothing is left to give");
    }
}
