//! How deeply a pickle's value nests, found without building it: a walk over the opcodes that
//! keeps only which containers hold which, then the longest chain of containment. A hostile
//! file nested 100,000 deep would otherwise overflow the stack of any recursive converter;
//! PyTorch's memory snapshots nest a handful of levels.
//!
//! The walk follows the opcodes `serde-pickle` reads (protocols 0–5). Objects built by REDUCE,
//! NEWOBJ, OBJ, INST and BUILD are counted as containers of their arguments (an overestimate,
//! never an underestimate). A file the walk cannot follow (an unknown opcode, a truncated
//! argument) gets `None`: the real parser then rejects it before building anything.
//!
//! Not for: reading values (see `replay`).

use std::collections::HashMap;

/// One value on the pickle machine's stack: a container (by id) or anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    Scalar,
    Node(usize),
}

/// The walk's state.
#[derive(Default)]
struct Walk {
    stack: Vec<Item>,
    marks: Vec<usize>,
    memo: HashMap<u64, Item>,
    /// Container children of each container.
    children: Vec<Vec<usize>>,
}

impl Walk {
    fn node(&mut self, items: &[Item]) -> Item {
        let kids = items
            .iter()
            .filter_map(|i| match i {
                Item::Node(n) => Some(*n),
                Item::Scalar => None,
            })
            .collect();
        self.children.push(kids);
        Item::Node(self.children.len() - 1)
    }
    fn pop(&mut self) -> Option<Item> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return None;
        }
        self.stack.pop()
    }
    fn pop_mark(&mut self) -> Option<Vec<Item>> {
        let m = self.marks.pop()?;
        (m <= self.stack.len()).then(|| self.stack.split_off(m))
    }
    /// Adds `items` (containers among them) to the container on top of the stack.
    fn extend_top(&mut self, items: &[Item]) -> Option<()> {
        if let Some(Item::Node(n)) = self.stack.last().copied() {
            for i in items {
                if let Item::Node(c) = i {
                    self.children[n].push(*c);
                }
            }
        }
        Some(())
    }
}

/// A little-endian unsigned integer of `n` bytes at `at`.
fn uint(bytes: &[u8], at: usize, n: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(n)?)?;
    Some(
        b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)),
    )
}

/// The nesting depth of the pickled value (1 for a flat list), or `None` when the walk cannot
/// follow the file.
pub fn nesting_depth(bytes: &[u8]) -> Option<usize> {
    let mut w = Walk::default();
    let mut at = 0usize;
    loop {
        let op = *bytes.get(at)?;
        at += 1;
        // Skips `n` bytes of argument; `len(k)` reads a k-byte length and skips that much.
        let skip = |at: &mut usize, n: u64| -> Option<()> {
            *at = at.checked_add(usize::try_from(n).ok()?)?;
            (*at <= bytes.len()).then_some(())
        };
        let line = |at: &mut usize| -> Option<()> {
            let end = bytes.get(*at..)?.iter().position(|&b| b == b'\n')?;
            *at += end + 1;
            Some(())
        };
        match op {
            b'.' => {
                let root = w.stack.pop()?;
                return Some(match root {
                    Item::Scalar => 0,
                    Item::Node(n) => longest_chain(&w.children, n),
                });
            }
            0x80 => skip(&mut at, 1)?,           // PROTO
            0x95 => skip(&mut at, 8)?,           // FRAME
            0x98 => {}                           // READONLY_BUFFER
            b'(' => w.marks.push(w.stack.len()), // MARK
            b'0' => {
                if w.pop().is_none() {
                    w.pop_mark()?;
                }
            }
            b'1' => drop(w.pop_mark()?), // POP_MARK
            b'2' => w.stack.push(*w.stack.last()?),
            // PUT, BINPUT, LONG_BINPUT (a text, 1-byte or 4-byte index), MEMOIZE (the next)
            b'p' | b'q' | b'r' | 0x94 => {
                let index = match op {
                    0x94 => w.memo.len() as u64,
                    _ => memo_index(bytes, &mut at, op == b'p', op == b'q')?,
                };
                let top = *w.stack.last()?;
                w.memo.insert(index, top);
            }
            // GET, BINGET, LONG_BINGET
            b'g' | b'h' | b'j' => {
                let index = memo_index(bytes, &mut at, op == b'g', op == b'h')?;
                let item = *w.memo.get(&index)?;
                w.stack.push(item);
            }
            // NONE, NEWTRUE, NEWFALSE, NEXT_BUFFER
            b'N' | 0x88 | 0x89 | 0x97 => w.stack.push(Item::Scalar),
            // INT, LONG, FLOAT, STRING, UNICODE, PERSID: a line
            b'I' | b'L' | b'F' | b'S' | b'V' | b'P' => {
                line(&mut at)?;
                w.stack.push(Item::Scalar);
            }
            // GLOBAL: two lines
            b'c' => {
                line(&mut at)?;
                line(&mut at)?;
                w.stack.push(Item::Scalar);
            }
            // Fixed-size arguments: BINFLOAT, BININT, BININT1, BININT2, EXT1, EXT2, EXT4
            b'G' | b'J' | b'K' | b'M' | 0x82 | 0x83 | 0x84 => {
                let n = match op {
                    b'G' => 8,
                    b'J' | 0x84 => 4,
                    b'K' | 0x82 => 1,
                    _ => 2,
                };
                skip(&mut at, n)?;
                w.stack.push(Item::Scalar);
            }
            // Length-prefixed data: LONG1, SHORT_BINBYTES, SHORT_BINSTRING, SHORT_BINUNICODE
            // (1 byte); LONG4, BINBYTES, BINSTRING, BINUNICODE (4); the *8 forms (8).
            0x8a | b'C' | b'U' | 0x8c | 0x8b | b'B' | b'T' | b'X' | 0x8d | 0x8e | 0x96 => {
                let k = match op {
                    0x8a | b'C' | b'U' | 0x8c => 1,
                    0x8b | b'B' | b'T' | b'X' => 4,
                    _ => 8,
                };
                let n = uint(bytes, at, k)?;
                at += k;
                skip(&mut at, n)?;
                w.stack.push(Item::Scalar);
            }
            // EMPTY_TUPLE, EMPTY_LIST, EMPTY_DICT, EMPTY_SET
            b')' | b']' | b'}' | 0x8f => {
                let n = w.node(&[]);
                w.stack.push(n);
            }
            // TUPLE, LIST, DICT, FROZENSET, OBJ: from the mark; INST also reads two lines.
            b't' | b'l' | b'd' | 0x91 | b'o' | b'i' => {
                if op == b'i' {
                    line(&mut at)?;
                    line(&mut at)?;
                }
                let items = w.pop_mark()?;
                let n = w.node(&items);
                w.stack.push(n);
            }
            // TUPLE1..3
            0x85..=0x87 => {
                let k = usize::from(op - 0x84);
                let from = w.stack.len().checked_sub(k)?;
                let items = w.stack.split_off(from);
                let n = w.node(&items);
                w.stack.push(n);
            }
            // APPEND, BUILD: one item into the top
            b'a' | b'b' => {
                let item = w.pop()?;
                w.extend_top(&[item])?;
            }
            // SETITEM: key and value into the top
            b's' => {
                let v = w.pop()?;
                let k = w.pop()?;
                w.extend_top(&[k, v])?;
            }
            // APPENDS, SETITEMS, ADDITEMS: from the mark into the top
            b'e' | b'u' | 0x90 => {
                let items = w.pop_mark()?;
                w.extend_top(&items)?;
            }
            // STACK_GLOBAL, BINPERSID: pop, push a scalar
            0x93 | b'Q' => {
                let k = if op == 0x93 { 2 } else { 1 };
                for _ in 0..k {
                    w.pop()?;
                }
                w.stack.push(Item::Scalar);
            }
            // REDUCE, NEWOBJ (2 operands), NEWOBJ_EX (3): an object holding its arguments
            b'R' | 0x81 | 0x92 => {
                let k = if op == 0x92 { 3 } else { 2 };
                let mut items = Vec::with_capacity(k);
                for _ in 0..k {
                    items.push(w.pop()?);
                }
                let n = w.node(&items);
                w.stack.push(n);
            }
            _ => return None,
        }
    }
}

/// A memo index argument at `at`: a decimal line (`text`), one byte (`short`) or four bytes.
fn memo_index(bytes: &[u8], at: &mut usize, text: bool, short: bool) -> Option<u64> {
    if text {
        let end = bytes.get(*at..)?.iter().position(|&b| b == b'\n')?;
        let line = std::str::from_utf8(&bytes[*at..*at + end]).ok()?;
        *at += end + 1;
        return line.trim().parse().ok();
    }
    let n = if short { 1 } else { 4 };
    let index = uint(bytes, *at, n)?;
    *at += n;
    Some(index)
}

/// The longest chain of containment from `root` (1 for a container of no containers),
/// iteratively; a container met again on its own chain (a recursive structure) adds nothing.
fn longest_chain(children: &[Vec<usize>], root: usize) -> usize {
    let mut depth: Vec<usize> = vec![0; children.len()];
    let mut on_path = vec![false; children.len()];
    let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
    on_path[root] = true;
    while let Some(&mut (node, ref mut next)) = stack.last_mut() {
        if let Some(&child) = children[node].get(*next) {
            *next += 1;
            if depth[child] == 0 && !on_path[child] {
                on_path[child] = true;
                stack.push((child, 0));
            }
            continue;
        }
        let deepest = children[node].iter().map(|&c| depth[c]).max().unwrap_or(0);
        depth[node] = deepest + 1;
        on_path[node] = false;
        stack.pop();
    }
    depth[root]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_pickle::{SerOptions, Value};

    fn nested(levels: usize) -> Value {
        let mut v = Value::List(vec![Value::I64(1)]);
        for _ in 1..levels {
            v = Value::List(vec![v, Value::String("x".into())]);
        }
        v
    }

    #[test]
    fn depth_of_values_pickled_by_serde_pickle() {
        for levels in [1, 2, 7, 300] {
            let bytes = serde_pickle::value_to_vec(&nested(levels), SerOptions::new()).unwrap();
            assert_eq!(nesting_depth(&bytes), Some(levels), "{levels}");
        }
        let scalar = serde_pickle::value_to_vec(&Value::I64(5), SerOptions::new()).unwrap();
        assert_eq!(nesting_depth(&scalar), Some(0));
    }

    #[test]
    fn depth_through_the_memo_and_python_opcodes() {
        // Python protocol 2 for [[[]], {"k": ([],)}], 4 deep through the dict, tuple and list:
        // ] q0 ( ] q1 ] q2 a } q3 X k ] q4 85 s e .
        let mut p = vec![
            0x80, 2, b']', b'q', 0, b'(', b']', b'q', 1, b']', b'q', 2, b'a',
        ];
        p.extend([
            b'}', b'q', 3, b'X', 1, 0, 0, 0, b'k', b']', b'q', 4, 0x85, b's', b'e', b'.',
        ]);
        assert_eq!(nesting_depth(&p), Some(4));
        // A list made 1,000 deep through memo gets: each level appends the previous one.
        let mut deep = vec![0x80, 2, b']', b'q', 0];
        for i in 1..1000u32 {
            deep.extend([b']', b'r']);
            deep.extend(i.to_le_bytes());
            deep.extend([b'j']);
            deep.extend((i - 1).to_le_bytes());
            deep.push(b'a');
        }
        deep.push(b'.');
        assert_eq!(nesting_depth(&deep), Some(1000));
    }

    #[test]
    fn files_the_walk_cannot_follow_are_left_to_the_parser() {
        assert_eq!(nesting_depth(&[0x80, 3, b'}']), None);
        assert_eq!(nesting_depth(&[0xff, b'.']), None);
        assert_eq!(nesting_depth(b"X\xff\xff\xff\x7f."), None);
    }
}
