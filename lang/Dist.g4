// Dist.g4: the grammar of .dist scripts.
//
// Sits at the very front of the data flow: ANTLR generates a lexer and a parser from this file at
// build time; lang/parse.cpp turns the parse tree into the project's own AST and no ANTLR type
// leaves lang/. Newlines carry no meaning; `#` starts a comment that runs to the end of the line.
// Comments live on a hidden channel so that the formatter can keep them.
grammar Dist;

script      : statement* EOF ;

statement   : importStmt
            | templateDef
            | presetDef
            | letStmt
            | modelStmt
            | block
            ;

importStmt  : 'import' STRING ;
templateDef : 'model' ident '(' (param (',' param)* ','?)? ')' '{' modelItem* '}' ;
param       : ident ('=' expr)? ;
presetDef   : 'preset' ident '=' call ;
letStmt     : 'let' ident '=' expr ;
modelStmt   : 'model' '=' call ;

// Configuration blocks: `mesh { ... }`, `schedule { ... }`, `train { optimizer { ... } }`.
// A field and a nested block share their first token, so the choice comes right after the name
// (and a mistake there reads "expected `:` or `{`").
block       : ident blockBody ;
blockBody   : '{' blockItem* '}' ;
blockItem   : ident (':' value ','? | blockBody)
            | tableRow
            ;
value       : expr ('x' expr)? ;               // `h200 x 8` counts devices
tableRow    : 'rank' expr ':' NAME* ;          // `rank 0: 0F0 0F1 0B0 0B1`

// Model template bodies: named layers, repeated blocks and residual groups.
modelItem   : letStmt
            | layerStmt
            ;
layerStmt   : (ident ':')? layerExpr shard? ;
layerExpr   : call                                  # LayerCall
            | 'repeat' expr '{' modelItem* '}'      # Repeat
            | 'residual' '{' modelItem* '}'         # Residual
            ;
shard       : 'shard' ident ;

expr        : <assoc=right> expr '**' expr          # Pow
            | op=('-' | '+') expr                   # Unary
            | expr op=('*' | '/' | '//' | '%') expr # Mul
            | expr op=('+' | '-') expr              # Add
            | primary                               # Prim
            ;

primary     : number
            | STRING
            | 'true'
            | 'false'
            | call
            | ident
            | '(' expr ')'
            | '(' expr ',' (expr (',' expr)* ','?)? ')'
            | '[' (expr (',' expr)* ','?)? ']'
            ;
number      : (INT | FLOAT) unit? ;
unit        : 'B' | 'KB' | 'MB' | 'GB' | 'TB' | 'KiB' | 'MiB' | 'GiB' | 'TiB' ;
call        : ident '(' (arg (',' arg)* ','?)? ')' ;
arg         : (ident ':')? expr ;

// Soft keywords may still name things.
ident       : NAME | 'x' | 'rank' | 'shard' ;

// Entry point for `--set KEY=VALUE` values.
setValue    : value EOF ;

FLOAT       : DIGITS '.' DIGITS EXPONENT? | DIGITS EXPONENT ;
INT         : DIGITS ;
// A name may start with digits so that `1f1b` and the action notation `0F0` read naturally.
NAME        : [a-zA-Z_] [a-zA-Z0-9_]* | [0-9]+ [a-zA-Z_] [a-zA-Z0-9_]* ;
STRING      : '"' (~["\\\r\n] | '\\' ~[\r\n])* '"' ;
UNTERMINATED_STRING : '"' (~["\\\r\n] | '\\' ~[\r\n])* ;
COMMENT     : '#' ~[\r\n]* -> channel(HIDDEN) ;
WS          : [ \t\r\n]+ -> skip ;
ERROR_CHAR  : . ;

fragment DIGITS   : [0-9] ('_'? [0-9])* ;
fragment EXPONENT : [eE] [+-]? [0-9]+ ;
